"""Proxy configuration: frozen dataclasses, resolved as flags > environment > TOML file > defaults.

Environment: ``IMP_LISTEN`` (host:port), ``IMP_UPSTREAM`` (a libpq URI/conninfo), ``IMP_CONFIG``
(path of the TOML file), ``IMP_HEAVY_BACKEND`` (auto | postgres | spark); the Spark backend also
reads ``IMP_SPARK_MASTER``, ``IMP_SPARK_CONF``, ``IMP_SPARK_JDBC_JAR``, ``IMP_SPARK_JDBC_URL``
(over the ``[spark]`` table; see docs/SPARK.md). TOML keys (all optional)::

    listen = "127.0.0.1:6432"
    upstream = "postgresql://postgres@127.0.0.1:5432/postgres"
    data_dir = "~/.local/share/imp-proxy"
    max_message_size = 1073741822
    sketches = true             # route sketchable SELECTs through the sketch hook
    service_pool_size = 4       # service connections per database
    decision_cache_size = 10000 # route decisions cached per query text
    connect_timeout = 10.0
    startup_timeout = 60.0      # a client must finish startup/auth within this (seconds)
    batch_wait = 0.01           # seconds a sketchable batch read in pieces waits between two
                                # of its messages for the rest (0: never)
    heavy_backend = "auto"      # where heavy sketch jobs run: auto | postgres | spark
    [library]                   # fields of sketches.manager.SketchSettings
    capture_after = 1           # capture on the N-th execution of a template
    unreused_captures = 4       # after that many captures never used again, capture a
                                # query at its second execution (0: at first sight)
    fragments = 1000
    [tls]
    cert = "/path/server.crt"
    key = "/path/server.key"
    [spark]                     # sketches.backends.spark.SparkSettings + cost thresholds
    master = "local[*]"         # or spark://host:7077, yarn, ...
    jdbc_jar = "/usr/share/java/postgresql.jar"
    spark_min_rows = 200000000  # auto mode: Spark only for jobs at least this large ...
    spark_min_cost = 5000000    # ... whose capture plan costs at least this much
    "spark.executor.memory" = "4g"   # any spark.* setting (quoted or as dotted keys)
"""

from __future__ import annotations

import math
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import psycopg

from sketches.cost import MODES as HEAVY_BACKENDS

from .protocol.framing import DEFAULT_MAX_MESSAGE


class ConfigError(ValueError):
    """A configuration value is missing, malformed or inconsistent."""


def default_data_dir() -> Path:
    """``$XDG_DATA_HOME/imp-proxy`` or ``~/.local/share/imp-proxy``; as root
    ``/var/lib/imp-proxy`` (the embedded PostgreSQL runs as ``postgres``, which cannot enter
    root's home directory)."""
    if os.environ.get("XDG_DATA_HOME"):
        return Path(os.environ["XDG_DATA_HOME"]) / "imp-proxy"
    if os.geteuid() == 0:
        return Path("/var/lib/imp-proxy")
    return Path.home() / ".local" / "share" / "imp-proxy"


def parse_listen(value: str) -> tuple[str, int]:
    """``host:port``, ``[v6]:port``, ``:port`` or a bare ``port`` (the last two on
    127.0.0.1, as the default)."""
    value = value.strip()
    if value.isdigit():
        host, port_s = "", value
    elif value.startswith("["):
        host, _, rest = value[1:].partition("]")
        if not rest.startswith(":"):
            raise ConfigError(f"listen address {value!r} is not [host]:port")
        port_s = rest[1:]
    else:
        host, sep, port_s = value.rpartition(":")
        if not sep:
            raise ConfigError(f"listen address {value!r} is not host:port")
    try:
        port = int(port_s)
    except ValueError as exc:
        raise ConfigError(f"invalid port in listen address {value!r}") from exc
    if not 0 <= port <= 65535:
        raise ConfigError(f"port out of range in listen address {value!r}")
    return host or "127.0.0.1", port


@dataclass(frozen=True, slots=True)
class TlsConfig:
    cert: Path
    key: Path


@dataclass(frozen=True, slots=True)
class ProxyConfig:
    listen_host: str = "127.0.0.1"
    listen_port: int = 6432
    upstream: str | None = None          # None: embedded local PostgreSQL under data_dir
    tls: TlsConfig | None = None
    data_dir: Path = field(default_factory=default_data_dir)
    max_message_size: int = DEFAULT_MAX_MESSAGE
    sketches: bool = True
    service_pool_size: int = 4
    decision_cache_size: int = 10000
    connect_timeout: float = 10.0
    startup_timeout: float = 60.0        # PostgreSQL's authentication_timeout default
    batch_wait: float = 0.01             # a batch read in pieces: intercept.batch_wanted
    library: tuple[tuple[str, str], ...] = ()  # SketchSettings overrides (name, value)
    heavy_backend: str = "auto"          # sketches.cost.MODES: auto | postgres | spark
    spark: tuple[tuple[str, str], ...] = ()    # the [spark] table, flattened (name, value)

    @property
    def listen(self) -> str:
        return f"{self.listen_host}:{self.listen_port}"

    def with_upstream(self, dsn: str) -> ProxyConfig:
        return replace(self, upstream=dsn)


_SIMPLE_KEYS = {f.name for f in fields(ProxyConfig)} - {"listen_host", "listen_port", "tls",
                                                         "library", "spark"}

# the [spark] table's own keys (besides any spark.* setting): SparkSettings.from_sources and
# the cost model's thresholds (sketches.cost.CostSettings)
SPARK_KEYS = frozenset({"master", "jdbc_jar", "jdbc_url", "max_partitions", "spark_min_rows",
                        "spark_min_cost"})


def _apply(cfg: ProxyConfig, values: Mapping[str, Any], origin: str) -> ProxyConfig:
    changes: dict[str, Any] = {}
    for key, value in values.items():
        if value is None:
            continue
        if key == "listen":
            changes["listen_host"], changes["listen_port"] = parse_listen(str(value))
        elif key == "tls":
            if not isinstance(value, Mapping) or not {"cert", "key"} <= set(value):
                raise ConfigError(f"{origin}: [tls] needs both cert and key")
            changes["tls"] = TlsConfig(Path(value["cert"]).expanduser(),
                                       Path(value["key"]).expanduser())
        elif key in ("tls_cert", "tls_key"):
            continue  # combined below
        elif key == "library":
            changes["library"] = _library_settings(cfg.library, value, origin)
        elif key == "spark":
            changes["spark"] = _spark_settings(cfg.spark, value, origin)
        elif key in _SIMPLE_KEYS:
            changes[key] = _coerce(key, value, origin)
        else:
            raise ConfigError(f"{origin}: unknown setting {key!r}")
    cert, key_ = values.get("tls_cert"), values.get("tls_key")
    if cert is not None or key_ is not None:
        if cert is None or key_ is None:
            raise ConfigError(f"{origin}: TLS needs both a certificate and a key")
        changes["tls"] = TlsConfig(Path(str(cert)).expanduser(), Path(str(key_)).expanduser())
    return replace(cfg, **changes)


def _library_settings(current: tuple[tuple[str, str], ...], value: Any,
                      origin: str) -> tuple[tuple[str, str], ...]:
    """Merges a TOML ``[library]`` table or CLI ``NAME=VALUE`` strings into ``current``."""
    merged = dict(current)
    if not isinstance(value, Mapping | list | tuple):   # e.g. TOML library = 5
        raise ConfigError(f"{origin}: library settings must be a table ([library])")
    if isinstance(value, Mapping):
        merged.update({str(k): str(v).lower() if isinstance(v, bool) else str(v)
                       for k, v in value.items()})
    else:
        for item in value:
            name, sep, val = str(item).partition("=")
            if not sep or not name.strip():
                raise ConfigError(f"{origin}: library setting {item!r} is not NAME=VALUE")
            merged[name.strip()] = val.strip()
    return tuple(sorted(merged.items()))


def _flatten(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A TOML table with dotted keys (``spark.sql.shuffle.partitions = 8`` is a nested
    table) as ``{"spark.sql.shuffle.partitions": 8}``."""
    out: dict[str, Any] = {}
    for k, v in table.items():
        name = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(_flatten(v, f"{name}."))
        else:
            out[name] = v
    return out


def _spark_settings(current: tuple[tuple[str, str], ...], value: Any,
                    origin: str) -> tuple[tuple[str, str], ...]:
    """Merges a TOML ``[spark]`` table into ``current``: its own keys (:data:`SPARK_KEYS`)
    and any ``spark.*`` setting (``[spark.conf]`` entries count as ``spark.*`` too)."""
    if not isinstance(value, Mapping):
        raise ConfigError(f"{origin}: [spark] must be a table")
    merged = dict(current)
    for name, v in _flatten(value).items():
        key = name.removeprefix("conf.")
        if key not in SPARK_KEYS and not key.startswith("spark."):
            raise ConfigError(f"{origin}: unknown [spark] setting {name!r}; known: "
                              f"{sorted(SPARK_KEYS)} and any spark.* setting")
        if key in ("max_partitions", "spark_min_rows", "spark_min_cost"):
            try:
                if float(v) < 0:
                    raise ValueError("must not be negative")
            except ValueError as exc:
                raise ConfigError(f"{origin}: invalid value for spark {key}: {v!r} "
                                  f"({exc})") from exc
        merged[key] = str(v).lower() if isinstance(v, bool) else str(v)
    return tuple(sorted(merged.items()))


def _coerce(key: str, value: Any, origin: str) -> Any:
    try:
        if key == "data_dir":
            return Path(str(value)).expanduser()
        if key in ("max_message_size", "service_pool_size", "decision_cache_size"):
            if isinstance(value, bool | float):   # TOML true or 2.9 is no count
                raise ValueError("must be an integer")
            n = int(value)
            if n <= 0:
                raise ValueError("must be positive")
            return n
        if key in ("connect_timeout", "startup_timeout"):
            if isinstance(value, bool):
                raise ValueError("must be a number of seconds")
            t = float(value)
            if not math.isfinite(t) or t <= 0:
                raise ValueError("must be a positive number of seconds")
            return t
        if key == "batch_wait":
            if isinstance(value, bool):
                raise ValueError("must be a number of seconds")
            t = float(value)
            if not math.isfinite(t) or t < 0:
                raise ValueError("must be a number of seconds, 0 or more")
            return t
        if key == "upstream":
            return _checked_dsn(str(value))
        if key == "sketches":
            if isinstance(value, bool):
                return value
            return parse_bool(str(value))
        if key == "heavy_backend":
            mode = str(value).strip().lower()
            if mode not in HEAVY_BACKENDS:
                raise ValueError(f"must be one of {', '.join(HEAVY_BACKENDS)}")
            return mode
        return str(value)
    except ValueError as exc:
        shown = "the DSN" if key == "upstream" else repr(value)
        raise ConfigError(f"{origin}: invalid value for {key}: {shown} ({exc})") from exc


def _checked_dsn(dsn: str) -> str:
    """``dsn`` when libpq can parse it and names at most one host; else a ValueError that does
    not repeat the text (it may hold a password). Why one host: the relay connects clients to
    the upstream itself, to one address (libpq would try several in turn)."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        raise ValueError("not a libpq connection string or URI (not shown: it may hold a "
                         "password)") from None
    for key in ("host", "hostaddr", "port"):
        if "," in str(info.get(key) or ""):
            raise ValueError(f"several values of {key}: the relay connects to one server")
    port = str(info.get("port") or "5432")
    if not port.isdigit() or not 0 < int(port) <= 65535:
        raise ValueError(f"invalid port {port!r}")
    return dsn


def parse_bool(text: str) -> bool:
    t = text.strip().lower()
    if t in ("1", "true", "on", "yes"):
        return True
    if t in ("0", "false", "off", "no"):
        return False
    raise ValueError(f"not a boolean: {text!r}")


def load_config(flags: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None,
                config_file: str | Path | None = None) -> ProxyConfig:
    """Resolves the configuration: ``flags`` (None values = not given) > ``env`` > file."""
    flags = dict(flags or {})
    env = os.environ if env is None else env
    path = config_file or flags.pop("config", None) or env.get("IMP_CONFIG")
    flags.pop("config", None)
    cfg = ProxyConfig()
    if path:
        p = Path(str(path)).expanduser()
        try:
            data = tomllib.loads(p.read_text())
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read config file {p}: {exc}") from exc
        cfg = _apply(cfg, data, str(p))
    env_values = {"listen": env.get("IMP_LISTEN") or None,
                  "upstream": env.get("IMP_UPSTREAM") or None,
                  "heavy_backend": env.get("IMP_HEAVY_BACKEND") or None}
    cfg = _apply(cfg, env_values, "environment")
    return _apply(cfg, flags, "command line")
