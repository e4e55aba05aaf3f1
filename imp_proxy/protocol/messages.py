"""Typed PostgreSQL v3 protocol messages the proxy reads or writes (frozen, slotted dataclasses).

Only what the proxy must understand is modelled; everything else travels as opaque bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PROTOCOL_V3 = 196608  # 3 << 16
SSL_REQUEST_CODE = 80877103
GSSENC_REQUEST_CODE = 80877104
CANCEL_REQUEST_CODE = 80877102

# frontend message type bytes
QUERY = ord("Q")
PARSE = ord("P")
BIND = ord("B")
DESCRIBE = ord("D")
EXECUTE = ord("E")
SYNC = ord("S")
FLUSH = ord("H")
CLOSE = ord("C")
TERMINATE = ord("X")
FUNCTION_CALL = ord("F")
COPY_DATA = ord("d")
COPY_DONE = ord("c")
COPY_FAIL = ord("f")
PASSWORD = ord("p")

# backend message type bytes
AUTHENTICATION = ord("R")
BACKEND_KEY_DATA = ord("K")
PARAMETER_STATUS = ord("S")
READY_FOR_QUERY = ord("Z")
ERROR_RESPONSE = ord("E")
NOTICE_RESPONSE = ord("N")
ROW_DESCRIPTION = ord("T")
DATA_ROW = ord("D")
COMMAND_COMPLETE = ord("C")
PARSE_COMPLETE = ord("1")
BIND_COMPLETE = ord("2")
CLOSE_COMPLETE = ord("3")
NO_DATA = ord("n")
PARAMETER_DESCRIPTION = ord("t")
PORTAL_SUSPENDED = ord("s")
EMPTY_QUERY_RESPONSE = ord("I")
NOTIFICATION_RESPONSE = ord("A")

# authentication request codes
AUTH_OK = 0
AUTH_CLEARTEXT = 3
AUTH_MD5 = 5
AUTH_SASL = 10
AUTH_SASL_CONTINUE = 11
AUTH_SASL_FINAL = 12

TEXT_FORMAT = 0
BINARY_FORMAT = 1


# ---- startup-phase packets (no type byte) ----

@dataclass(frozen=True, slots=True)
class StartupMessage:
    protocol: int
    params: dict[str, str]
    raw: bytes = field(repr=False)  # the packet exactly as received, forwarded unchanged


@dataclass(frozen=True, slots=True)
class SSLRequest:
    pass


@dataclass(frozen=True, slots=True)
class GSSENCRequest:
    pass


@dataclass(frozen=True, slots=True)
class CancelRequest:
    pid: int
    secret: int


StartupPacket = StartupMessage | SSLRequest | GSSENCRequest | CancelRequest


# ---- frontend messages ----

@dataclass(frozen=True, slots=True)
class Query:
    sql: str


@dataclass(frozen=True, slots=True)
class Parse:
    name: str
    sql: str
    param_types: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Bind:
    portal: str
    statement: str
    param_formats: tuple[int, ...]
    params: tuple[bytes | None, ...]
    result_formats: tuple[int, ...]

    def param_format(self, i: int) -> int:
        """The format code of parameter ``i`` (PostgreSQL's 0/1/n format-code rule)."""
        if not self.param_formats:
            return TEXT_FORMAT
        if len(self.param_formats) == 1:
            return self.param_formats[0]
        return self.param_formats[i]


@dataclass(frozen=True, slots=True)
class Describe:
    kind: str  # "S" statement | "P" portal
    name: str


@dataclass(frozen=True, slots=True)
class Execute:
    portal: str
    max_rows: int


@dataclass(frozen=True, slots=True)
class Close:
    kind: str  # "S" | "P"
    name: str


@dataclass(frozen=True, slots=True)
class Sync:
    pass


@dataclass(frozen=True, slots=True)
class Flush:
    pass


@dataclass(frozen=True, slots=True)
class Terminate:
    pass


# ---- backend messages ----

@dataclass(frozen=True, slots=True)
class Authentication:
    code: int
    payload: bytes  # salt (md5), SASL data, ...


@dataclass(frozen=True, slots=True)
class AuthenticationSASL:
    mechanisms: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class BackendKeyData:
    pid: int
    secret: int


@dataclass(frozen=True, slots=True)
class ParameterStatus:
    name: str
    value: str


@dataclass(frozen=True, slots=True)
class ReadyForQuery:
    status: str  # "I" idle | "T" in transaction | "E" failed transaction


@dataclass(frozen=True, slots=True)
class ErrorResponse:
    """ErrorResponse / NoticeResponse fields by their one-letter code (S, V, C, M, D, H, P, ...)."""

    fields: dict[str, str]

    @property
    def severity(self) -> str:
        return self.fields.get("S", "")

    @property
    def sqlstate(self) -> str:
        return self.fields.get("C", "")

    @property
    def message(self) -> str:
        return self.fields.get("M", "")


@dataclass(frozen=True, slots=True)
class FieldDescription:
    name: str
    table_oid: int = 0
    column: int = 0
    type_oid: int = 25  # text
    type_size: int = -1
    type_modifier: int = -1
    format: int = TEXT_FORMAT


@dataclass(frozen=True, slots=True)
class RowDescription:
    fields: tuple[FieldDescription, ...]


@dataclass(frozen=True, slots=True)
class DataRow:
    values: tuple[bytes | None, ...]


@dataclass(frozen=True, slots=True)
class CommandComplete:
    tag: str
