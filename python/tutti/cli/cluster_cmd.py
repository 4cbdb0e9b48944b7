"""tutti-admin cluster serve: keep a store's blocks reachable by the cluster tier (docs/cluster.md).

A vLLM engine with ``cluster_*`` keys runs a ClusterNode itself while it serves; when it stops, its
entries leave the cluster with it.  ``cluster serve`` opens a store (exclusively, like the engine)
and runs a node over it until SIGTERM or Ctrl-C: it publishes everything the store holds and serves
peers' fetches, verified, from it.  Useful to keep what a stopped engine computed available, and
to the tests.  Needs ``pip install 'tutti[cluster]'`` (Mooncake).
"""
from __future__ import annotations

import dataclasses
import signal
import threading

import click

from .app import AdminGroup, main
from .common import EXIT_CODES, EXIT_STORE, EXIT_USAGE, CliError, _emit_json, _json_opt, _open, _paths_arg


@main.group("cluster", cls=AdminGroup, epilog=EXIT_CODES)
def cluster_group():
    """The cluster tier on Mooncake: serve a store's blocks to other nodes, show what the cluster holds."""


@cluster_group.command("serve", epilog=EXIT_CODES)
@_paths_arg()
@click.option("--master", default="127.0.0.1:50051", show_default=True, help="mooncake_master RPC address")
@click.option("--metadata", default="http://127.0.0.1:8080/metadata", show_default=True,
              help="the master's HTTP metadata server")
@click.option("--host", default="127.0.0.1", show_default=True, help="this node's address as peers reach it")
@click.option("--port", type=click.IntRange(1, 65535), default=17001, show_default=True,
              help="this node's transfer port (its node id with --host)")
@click.option("--option", "-o", "options", multiple=True, metavar="KEY=VALUE",
              help="any other cluster_* key of docs/cluster.md, e.g. -o cluster_fetch_timeout_s=5")
@click.option("--check", "check_only", is_flag=True,
              help="check the options and open the store, then exit 0 without joining the cluster")
@_json_opt
def serve_cmd(paths, master, metadata, host, port, options, check_only, as_json):
    """Publish a store's blocks and serve them to peers until SIGTERM or Ctrl-C.

    Prints one line when the node is serving (--json: one JSON object), then runs until stopped; on
    stop it withdraws its entries from the cluster (bounded) and exits 0.
    """
    from ..cluster import ClusterConfig, ClusterNode
    from ..errors import ClusterError

    extra = {"cluster_master": master, "cluster_metadata": metadata, "cluster_host": host, "cluster_port": port}
    for opt in options:
        key, eq, value = opt.partition("=")
        if not eq or not key.startswith("cluster_"):
            raise CliError(f"--option {opt!r}: expected cluster_KEY=VALUE", EXIT_USAGE)
        extra[key] = value
    try:
        cfg = ClusterConfig.from_extra_config(extra)
    except ClusterError as e:
        raise CliError(str(e), EXIT_USAGE) from None
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with _open(paths, "cluster serve") as store:
        from ..cluster.config import check_staging
        try:
            check_staging(cfg, store.block_bytes)  # batch x in-flight x this store's blocks: bounded
        except ClusterError as e:
            raise CliError(str(e), EXIT_USAGE) from None
        if check_only:
            info = {"endpoint": cfg.endpoint, "master": cfg.master, "store_uuid": store.uuid,
                    "blocks": len(store.committed()), "checked": True}
            if as_json:
                _emit_json(info)
            else:
                click.echo(f"would serve {info['blocks']} blocks of {', '.join(paths)} at {cfg.endpoint} "
                           f"(master {cfg.master}); options and store checked, the cluster not joined")
            return
        try:
            node = ClusterNode(store, cfg)
        except ClusterError as e:  # Mooncake missing, master or metadata server unreachable, port taken
            raise CliError(str(e), EXIT_STORE) from None
        try:
            with node.store_lock:  # the node's threads are serving already
                blocks = len(store.committed())
            info = {"endpoint": cfg.endpoint, "master": cfg.master, "store_uuid": store.uuid,
                    "blocks": blocks, "published": node.stats["published"]}
            if as_json:
                _emit_json(info)
            else:
                click.echo(f"serving {info['blocks']} blocks of {', '.join(paths)} at {cfg.endpoint} "
                           f"(master {cfg.master}); SIGTERM or Ctrl-C stops")
            while not stop.wait(1.0):
                pass
        finally:
            node.close()


@cluster_group.command("status", epilog=EXIT_CODES)
@click.option("--master", default="127.0.0.1:50051", show_default=True, help="mooncake_master RPC address")
@click.option("--metadata", default="http://127.0.0.1:8080/metadata", show_default=True,
              help="the master's HTTP metadata server")
@click.option("--admin", default=None, metavar="URL",
              help="the master's admin HTTP service (--metrics_port) [default: http://MASTER-HOST:9003]")
@click.option("--host", default="127.0.0.1", show_default=True, help="this client's address (it reads records)")
@click.option("--port", type=click.IntRange(0, 65535), default=0, show_default=True,
              help="this client's transfer port (0: a free one)")
@click.option("--names-only", is_flag=True, help="list nodes and counts from the master only; read no record")
@_json_opt
def status_cmd(master, metadata, admin, host, port, names_only, as_json):
    """Nodes, blocks and counters of every model in the cluster.

    One line per node: the blocks its store holds, what it published, served and fetched, peers it
    skips for now (quarantined), and how old its record is (each node refreshes it every 10 s). Reads the
    master's admin HTTP service and, through a lookup-only client, the nodes' records.
    """
    from ..cluster import ClusterConfig
    from ..cluster.errors import ClusterError
    from ..cluster.local_master import free_port
    from ..cluster.status import gather

    if admin is None:
        admin = f"http://{master.rpartition(':')[0] or '127.0.0.1'}:9003"
    if not admin.startswith(("http://", "https://")) or any(ord(c) <= 32 for c in admin) or len(admin) > 1024:
        raise CliError(f"--admin {admin[:60]!r}: expected an http:// or https:// URL", EXIT_USAGE)
    try:
        cfg = ClusterConfig(master=master, metadata=metadata, host=host, port=port or free_port())
        cfg.check()
    except ClusterError as e:
        raise CliError(str(e), EXIT_USAGE) from None
    try:  # the records through a lookup-only client, as the vLLM scheduler's: no segment of its own
        st = gather(admin, None if names_only else dataclasses.replace(cfg, index_bytes=0))
    except ClusterError as e:
        raise CliError(str(e), EXIT_STORE) from None
    if as_json:
        _emit_json(st)
        return
    m = st["master"]
    click.echo(f"master {master}: {m.get('role', '?')}, {m.get('ha_state', m.get('status', '?'))} "
               f"(admin {st['admin']}); {len(st['models'])} model(s)")
    for model in st["models"]:
        click.echo(f"model {model['model'] or '?'} (index {model['fp_id'][:12]}…): {len(model['nodes'])} node(s), "
                   f"{model['descriptors']} blocks indexed")
        for n in model["nodes"]:
            s = n.get("stats", {})
            if n.get("unread") or n.get("old_record"):
                click.echo(f"  {n['endpoint']}: {'record not read' if n.get('unread') else 'no counters (older node)'}")
                continue
            mib = 1 << 20
            q = ", ".join(n.get("quarantined") or []) or "none"
            click.echo(f"  {n['endpoint']}: {n.get('blocks', '?')}/{n.get('slots', '?')} blocks held, "
                       f"published {s.get('published', 0)}, served {s.get('blocks_served', 0)} "
                       f"({s.get('bytes_served', 0) / mib:.1f} MiB), fetched {s.get('remote_hits', 0)} "
                       f"({s.get('bytes_fetched', 0) / mib:.1f} MiB), skipping {q}; record {n.get('age_s', '?')} s old"
                       + _copies(s))


def _copies(s: dict) -> str:
    """What the node did about copies (cluster_replicas, backups), when it did anything."""
    keys = (("replicas_claimed", "claims won"), ("replicas_dropped", "fetched copies dropped"),
            ("adopted", "copies published after their holder went"))
    parts = [f"{s[k]} {what}" for k, what in keys if s.get(k)]
    return ("; " + ", ".join(parts)) if parts else ""
