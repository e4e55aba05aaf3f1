"""``imp-proxy`` command line: ``serve``, ``install``, ``demo``.

Configuration precedence: flags > environment (IMP_LISTEN, IMP_UPSTREAM, IMP_CONFIG,
IMP_HEAVY_BACKEND) > TOML config file > defaults (see imp_proxy.config).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import fcntl
import importlib
import logging
import os
import signal
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sketches.cost import MODES as HEAVY_BACKENDS

from .config import ConfigError, ProxyConfig, load_config, parse_bool
from .embedded import EmbeddedPostgresError, LocalPostgres
from .router import PerDatabase, SketchHook

if TYPE_CHECKING:
    from sketches.backends.routing import RoutedBackend

log = logging.getLogger(__name__)


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="imp-proxy",
        description="PostgreSQL wire-compatible proxy that answers analytical SELECTs through "
                    "provenance sketches (IMP).",
        epilog="Environment: IMP_LISTEN, IMP_UPSTREAM, IMP_CONFIG, IMP_HEAVY_BACKEND "
               "(and IMP_SPARK_MASTER, IMP_SPARK_CONF, IMP_SPARK_JDBC_JAR, IMP_SPARK_JDBC_URL "
               "for the Spark backend). Flags win over the environment, which wins over the "
               "TOML config file. Exit status: 0 done, 2 configuration error, 3 the embedded "
               "PostgreSQL failed, 4 PostgreSQL refused or could not be reached, 128 + N "
               "stopped by signal N while starting (once serve listens, a stop signal is an "
               "orderly stop: 0).")
    parser.add_argument("--log-level", default="INFO", type=str.upper, choices=LOG_LEVELS,
                        help="logging level: DEBUG, INFO, WARNING, ERROR (default INFO)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", help="run the proxy",
                           description="Listen for PostgreSQL clients and relay them to the "
                                       "upstream server. Without an upstream, an embedded "
                                       "local PostgreSQL under --data-dir is started (and "
                                       "reused on the next run).")
    serve.add_argument("--listen", metavar="HOST:PORT",
                       help="address to listen on: HOST:PORT, [IPv6]:PORT or PORT alone "
                            "(on 127.0.0.1; default 127.0.0.1:6432; env IMP_LISTEN)")
    serve.add_argument("--upstream", metavar="DSN",
                       help="PostgreSQL to relay to, e.g. postgresql://user@host:5432/db; its "
                            "host/port receive the clients, its user/password are used for "
                            "the proxy's service connections (env IMP_UPSTREAM)")
    serve.add_argument("--config", metavar="FILE",
                       help="TOML config file (env IMP_CONFIG)")
    serve.add_argument("--data-dir", metavar="DIR",
                       help="where the embedded PostgreSQL lives "
                            "(default ~/.local/share/imp-proxy)")
    serve.add_argument("--tls-cert", metavar="FILE",
                       help="certificate (PEM) for TLS with clients; needs --tls-key")
    serve.add_argument("--tls-key", metavar="FILE", help="private key (PEM) for --tls-cert")
    serve.add_argument("--max-message-size", type=int, metavar="BYTES",
                       help="largest client message accepted (default 1 GiB - 2, "
                            "PostgreSQL's own limit)")
    serve.add_argument("--no-sketches", dest="sketches", action="store_const", const=False,
                       default=None,
                       help="relay only: never route queries through the sketch library")
    serve.add_argument("--hook", metavar="MODULE:CALLABLE",
                       help="factory returning the sketch hook (default: "
                            "sketches.manager.SketchManager when importable)")
    serve.add_argument("--library-setting", dest="library", action="append", metavar="NAME=VALUE",
                       help="sketch library setting (sketches.manager.SketchSettings), "
                            "repeatable, e.g. capture_after=3 or fragments=500")
    serve.add_argument("--heavy-backend", choices=HEAVY_BACKENDS,
                       help="where heavy sketch jobs (capture, operator state) run: auto "
                            "(PostgreSQL unless the cost model picks Spark for a large job), "
                            "postgres, or spark (falls back to PostgreSQL when Spark fails); "
                            "default auto (env IMP_HEAVY_BACKEND; Spark settings: the TOML "
                            "[spark] table, IMP_SPARK_MASTER, IMP_SPARK_CONF; docs/SPARK.md)")
    serve.add_argument("--service-pool-size", type=int, metavar="N",
                       help="service connections per database (default 4)")
    serve.add_argument("--decision-cache-size", type=int, metavar="N",
                       help="route decisions cached per query text (default 10000)")
    serve.add_argument("--connect-timeout", type=float, metavar="SECONDS",
                       help="timeout for upstream connections (default 10)")
    serve.add_argument("--startup-timeout", type=float, metavar="SECONDS",
                       help="a client that has not completed startup and authentication "
                            "within this time gets a FATAL error and is disconnected "
                            "(default 60, like PostgreSQL's authentication_timeout)")
    serve.add_argument("--batch-wait", type=float, metavar="SECONDS",
                       help="how long a sketchable extended-protocol batch that arrives in "
                            "pieces waits, between two of its messages, for the rest before "
                            "it goes on unwrapped (default 0.01; 0: never)")

    install = sub.add_parser("install", help="install the pg_extensions SQL into a database",
                             description="Apply pg_extensions (schema imp) to a database, "
                                         "idempotently.")
    install.add_argument("--upstream", metavar="DSN",
                         help="database to install into (env IMP_UPSTREAM; default: the "
                              "embedded PostgreSQL)")
    install.add_argument("--config", metavar="FILE", help="TOML config file (env IMP_CONFIG)")
    install.add_argument("--data-dir", metavar="DIR", help="embedded PostgreSQL location")

    demo = sub.add_parser("demo", help="load the IMP synthetic table into a throwaway PostgreSQL "
                                       "(or --upstream) and compare queries direct vs through "
                                       "the proxy")
    from .demo import add_arguments

    add_arguments(demo)
    return parser


def _flags(args: argparse.Namespace) -> dict[str, Any]:
    keys = ("listen", "upstream", "config", "data_dir", "tls_cert", "tls_key",
            "max_message_size", "sketches", "service_pool_size", "decision_cache_size",
            "connect_timeout", "startup_timeout", "batch_wait", "library", "heavy_backend")
    return {k: getattr(args, k, None) for k in keys}


def load_hook(spec: str | None, library: Sequence[tuple[str, str]] = (),
              heavy_backend: str = "auto",
              spark: Sequence[tuple[str, str]] = ()) -> SketchHook | None:
    """The sketch hook: ``MODULE:CALLABLE`` or SketchManager when the library is present
    (with ``library`` overriding fields of its SketchSettings, and the heavy backend built
    from ``heavy_backend`` and the ``[spark]`` settings ``spark``). A factory whose hooks
    belong to one database (``PER_DATABASE``: the library's manager, also when named with
    ``--hook``; found: named so, one manager served every database, and a sketch of one
    database's ``t`` answered another's) is built as the default is: one per database."""
    factory = _hook_factory(spec)
    if factory is None:
        return None
    if not getattr(factory, "PER_DATABASE", False):
        hook: SketchHook = factory()
        return hook
    from sketches.manager import SketchSettings
    settings = library_settings(SketchSettings, library)
    backend = make_backend(heavy_backend, spark)
    # the heavy backend is shared (thread-safe: decisions under a lock, one Spark session)
    return PerDatabase(lambda: factory(settings, backend=backend))


def _hook_factory(spec: str | None) -> Any:
    """The callable ``spec`` names, else the library's SketchManager (None without it)."""
    if spec:
        module, _, attr = spec.partition(":")
        try:
            return getattr(importlib.import_module(module), attr or "create_hook")
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"cannot load the hook {spec!r}: {exc}") from exc
    try:
        return importlib.import_module("sketches.manager").SketchManager
    except ImportError as exc:
        log.warning("sketch library not available (%s): relaying only", exc)
        return None


def make_backend(mode: str, spark: Sequence[tuple[str, str]] = ()) -> RoutedBackend:
    """``sketches.backends.routing.make_heavy_backend`` from the proxy's configuration: the
    ``[spark]`` table's cost thresholds go to the cost model, the rest to the Spark settings
    (over which the IMP_SPARK_* environment wins). Never imports pyspark; in ``spark`` mode
    the session starts now, in the background."""
    from sketches.backends.routing import make_heavy_backend
    from sketches.cost import CostSettings

    table: dict[str, str] = dict(spark)
    defaults = CostSettings()
    try:
        cost = CostSettings(
            mode=mode,
            spark_min_rows=float(table.pop("spark_min_rows", defaults.spark_min_rows)),
            spark_min_cost=float(table.pop("spark_min_cost", defaults.spark_min_cost)))
        backend = make_heavy_backend(mode, table, cost)
    except ValueError as exc:
        raise ConfigError(f"heavy backend: {exc}") from exc
    if backend.spark is None:
        log.info("heavy backend: %s (every heavy job runs in PostgreSQL)", mode)
    else:
        log.info("heavy backend: %s (Spark master %s; auto picks Spark for jobs of >= %s rows "
                 "and plan cost >= %s)", mode, backend.spark.settings.master,
                 f"{cost.spark_min_rows:,.0f}", f"{cost.spark_min_cost:,.0f}")
    return backend


def close_backends(hook: SketchHook | None) -> None:
    """Stops the heavy backend(s) of the hook's managers (the Spark session) at shutdown."""
    hooks = hook.hooks() if isinstance(hook, PerDatabase) else [hook]
    closed: set[int] = set()
    for h in hooks:
        backend = getattr(h, "backend", None)
        close = getattr(backend, "close", None)
        if callable(close) and id(backend) not in closed:
            closed.add(id(backend))
            close()


def library_settings(settings_cls: Any, overrides: Sequence[tuple[str, str]]) -> Any:
    """``settings_cls`` (a dataclass) with string overrides coerced to its fields' types."""
    defaults = settings_cls()
    known = {f.name for f in dataclasses.fields(settings_cls)}
    values: dict[str, Any] = {}
    for name, raw in overrides:
        if name not in known:
            raise ConfigError(f"unknown library setting {name!r}; known: {sorted(known)}")
        current = getattr(defaults, name)
        try:
            if isinstance(current, bool):
                values[name] = parse_bool(raw)
            elif isinstance(current, int):
                values[name] = int(raw)
            elif isinstance(current, float):
                values[name] = float(raw)
            else:
                values[name] = raw
        except ValueError as exc:
            raise ConfigError(f"invalid value for library setting {name}: {raw!r}") from exc
    try:
        return dataclasses.replace(defaults, **values)
    except ValueError as exc:   # the settings' own checks (a range, a strategy's name)
        raise ConfigError(f"invalid library settings: {exc}") from exc


def _postmaster(datadir: Path) -> tuple[int, int] | None:
    """(pid, port) of a postmaster running on ``datadir``, else None. A ``postmaster.pid``
    whose process is gone or is no postgres (its pid handed to another process after a
    reboot: found, serve then relayed to a cluster that was not running) is stale: it is
    removed, else PostgreSQL would refuse to start while that process lives."""
    pidfile = datadir / "postmaster.pid"
    try:
        lines = pidfile.read_text().splitlines()
        pid, port = int(lines[0]), int(lines[3])
    except (OSError, ValueError, IndexError):
        return None
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        comm = ""
    if comm == "postgres":
        return pid, port
    log.warning("removing the stale %s (process %d is not a postgres)", pidfile, pid)
    with contextlib.suppress(OSError):
        pidfile.unlink()
    return None


class DataDirBusy(EmbeddedPostgresError):
    """Another ``imp-proxy serve`` owns the embedded cluster of this data directory."""


@contextlib.contextmanager
def _data_dir_lock(data_dir: Path) -> Iterator[None]:
    """Holds ``data_dir``'s lock (``imp-proxy.lock``, written with this pid) while inside;
    raises :class:`DataDirBusy` when another process holds it. The holder owns the embedded
    cluster: it starts (or takes over) and stops it."""
    path = data_dir / "imp-proxy.lock"
    with path.open("a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            raise DataDirBusy(f"{data_dir} is in use by another imp-proxy (pid "
                              f"{f.read().strip() or '?'})") from None
        f.truncate(0)
        f.write(str(os.getpid()))
        f.flush()
        try:
            yield
        finally:
            f.truncate(0)
            fcntl.flock(f, fcntl.LOCK_UN)


@contextlib.contextmanager
def upstream_or_embedded(cfg: ProxyConfig, serving: bool = True) -> Iterator[ProxyConfig]:
    """``cfg`` unchanged when it names an upstream; else one with the embedded cluster's DSN
    over its Unix socket, under the data directory's lock (:func:`_data_dir_lock`): the
    cluster is started now, or taken over when one is running (left by a serve that died),
    and stopped on exit — also when the start fails or is interrupted. Without the lock
    (another serve owns the cluster) ``serving`` raises :class:`DataDirBusy`: that serve
    stops the cluster when it ends (found: a second serve reusing it lost its upstream),
    while ``install`` (``serving`` False) uses the running cluster and leaves it running."""
    if cfg.upstream is not None:
        yield cfg
        return
    datadir = cfg.data_dir / "pg" / "data"
    _usable_data_dir(cfg.data_dir)
    try:
        with _data_dir_lock(cfg.data_dir):
            with _embedded(datadir) as dsn:
                yield cfg.with_upstream(dsn)
    except DataDirBusy:
        running = None if serving else _postmaster(datadir)
        if running is None:
            raise
        yield cfg.with_upstream(LocalPostgres(datadir=datadir, port=running[1],
                                              throwaway=False).socket_dsn())


def _usable_data_dir(data_dir: Path) -> None:
    """Creates ``data_dir`` when missing; :class:`ConfigError` (one line, status 2) when it
    cannot be used. Why: a file, or a path that cannot be created, ended serve and install
    with a traceback and status 1 (found by a helper's search)."""
    try:
        if not data_dir.exists():
            data_dir.mkdir(parents=True)
            data_dir.chmod(0o755)  # the server user must be able to enter it
        if not data_dir.is_dir():
            raise ConfigError(f"--data-dir {data_dir} is not a directory")
        (data_dir / "imp-proxy.lock").touch()
    except OSError as exc:
        raise ConfigError(f"--data-dir {data_dir}: {exc.strerror or exc}") from None


@contextlib.contextmanager
def _embedded(datadir: Path) -> Iterator[str]:
    """The embedded cluster's DSN: the running one taken over, else one started; stopped
    when the block ends."""
    running = _postmaster(datadir)
    if running is not None:
        log.info("taking over the embedded PostgreSQL on port %d (%s)", running[1], datadir)
        pg = LocalPostgres(datadir=datadir, port=running[1], throwaway=False, pid=running[0])
    else:
        pg = LocalPostgres(datadir=datadir, throwaway=False)
        log.info("starting the embedded PostgreSQL in %s on port %d", datadir, pg.port)
    try:
        if running is None:
            pg.start()
        yield pg.socket_dsn()
    finally:
        pg.stop()


def cmd_serve(args: argparse.Namespace) -> int:
    from .server import ProxyServer, ProxyStartError, new_event_loop

    cfg = load_config(_flags(args))
    if cfg.upstream is None:   # before the library's start says anything
        _usable_data_dir(cfg.data_dir)
    hook = load_hook(args.hook, cfg.library, cfg.heavy_backend, cfg.spark) \
        if cfg.sketches else None
    with upstream_or_embedded(cfg) as cfg:
        loop = new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            server = ProxyServer(cfg, hook)
            loop.run_until_complete(server.start())
        except ProxyStartError as exc:
            print(f"imp-proxy: {exc}", file=sys.stderr)
            return 2
        print(f"imp-proxy listening on {cfg.listen_host}:{server.port}", file=sys.stderr,
              flush=True)
        task = loop.create_task(server.serve_forever())
        for sig in STOP_SIGNALS:   # SIGHUP too: no reload; a closed terminal stops it cleanly
            loop.add_signal_handler(sig, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            loop.run_until_complete(task)
        loop.run_until_complete(server.close())
        loop.close()
        close_backends(hook)
    return 0


def cmd_install(args: argparse.Namespace) -> int:
    import psycopg

    import pg_extensions

    cfg = load_config(_flags(args))
    with upstream_or_embedded(cfg, serving=False) as cfg, \
            psycopg.connect(str(cfg.upstream),
                            connect_timeout=max(1, round(cfg.connect_timeout))) as conn:
        applied = pg_extensions.install(conn)
    print("applied: " + (", ".join(applied) if applied else "nothing (already up to date)"))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run

    return run(args)


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _stop(signum: int, _frame: object) -> None:
    """SIGTERM or SIGHUP before the event loop takes them (or in ``install``/``demo``): leave
    through the ``finally`` blocks, so an embedded or throwaway cluster started so far is
    stopped (found: one left running after a signal during its start)."""
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    import psycopg

    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=getattr(logging, args.log_level),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _stop)
    # also when started ignoring it (a background job of a shell without job control): the
    # event loop takes it later anyway, and one ignored during the embedded cluster's start
    # left serve running (found in CI: `nohup bash .ci/run &`)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        if args.command == "serve":
            return cmd_serve(args)
        if args.command == "install":
            return cmd_install(args)
        return cmd_demo(args)
    except ConfigError as exc:
        print(f"imp-proxy: configuration error: {exc}", file=sys.stderr)
        return 2
    except EmbeddedPostgresError as exc:
        print(f"imp-proxy: embedded PostgreSQL failed: {exc}", file=sys.stderr)
        return 3
    except psycopg.Error as exc:   # install, demo: PostgreSQL's own message
        print(f"imp-proxy: {exc}", file=sys.stderr)
        return 4
    except KeyboardInterrupt:
        return 128 + signal.SIGINT


if __name__ == "__main__":
    sys.exit(main())
