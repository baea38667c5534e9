"""The harness of vmigd's integration tests, the demo and the bench: network namespaces (net),
vmigd daemons and vmigctl (daemons), TLS material (tls) and what crosses the node hop (nodehop),
QEMU and the test guest (qemu), migrations (migrate), the testbed that wires them (testbed),
rates from `metrics --json` (rates), Prometheus text (prometheus), how a test reports (checks),
convergence runs (converge), throw-away libvirtds (virt) and the DPDK hop's tool run as a pair
(dpdk). Stdlib only; every wait has a deadline, every resource is released by a context
manager.

A test puts tests/lib on sys.path and writes `import vmigtest as vt`; the names below are the
ones tests use. Anything else is in its module (vt.tls.cert_info, vt.virt.Libvirtd...)."""

from . import converge, dpdk, stockpeer, virt
from . import virtmigrate  # noqa: F401 -- vt.virtmigrate, for test_kubevirt_libvirt
from .base import (DEFAULT_PORT_ID, MIB, REPO_ROOT, SKIP_EXIT, HarnessError, Skip, log,
                   stop_process, tail, tool_binary, wait_until, work_directory)
from .checks import Checks, answers, run_main, still_in_flight, within
from .daemons import (Daemon, VmigctlError, digest_problems, find_binaries, find_test_daemon,
                      migration_connections, parse_linked, stop_lines,
                      run_vmigd, status_connections, status_field, status_migration,
                      status_inspect, status_migration_count, status_migrations,
                      stop_quietly)
from .migrate import (DEFAULT_MAX_BANDWIDTH, DaemonMigration, MigrationResult,
                      configure_migration, migrate_direct, migrate_via_daemons,
                      start_via_daemons, verify_memory, wait_failed_at_home,
                      wait_migration)
from .net import (NetPair, UnixServer, digest_all, netns_prefix, netns_socket, peer_closed,
                  read_until_close, recv_all, wait_closed)
from .nodehop import (REPLY_BAD_VERSION, REPLY_DUPLICATE, REPLY_MALFORMED, REPLY_NOT_THE_PEER,
                      REPLY_OK, REPLY_UNKNOWN_KEY, REPLY_UNKNOWN_PORT, Sniffer, TLSProbe,
                      node_hop_preamble, plaintext_hits, probe_tls_accepted, ram_page_prefixes,
                      reply_status, tls_connect)
from .prometheus import http_get, parse_prometheus, prom_value
from .qemu import (GUEST_READY, QMP, GuestReport, GuestSpec, QMPError, Qemu, guest_binary,
                   random_ram_file)
from .ramimage import realistic_ram_file, zstd_ratio
from .qemuversions import machine_for, qemu_binary, qemu_version, resolve_qemu, side_qemu
from .rates import (RateSample, RateWatch, backlogged, cpu_idle_between, flow_span, fmt_rates,
                    held_back, held_shares, qemu_faults_between, qemu_pending, rate_between,
                    window_rates)
from .stockpeer import StockPeer, StockTestbed, stockpeer_binary
from .testbed import Testbed
from .tls import (CLIENT_CN, CRYPTO_MODES, DEFAULT_TLS_ALLOW, NODE_CN, PKI, CertFiles,
                  atomic_write, install_tls, leaf_until, make_pki, normalize_serial,
                  rotate_tls, shows_serial, tls_paths)

__all__ = [  # what `from vmigtest import *` gives; the same names as above
    'converge', 'stockpeer', 'virt',
    'DEFAULT_PORT_ID', 'MIB', 'REPO_ROOT', 'SKIP_EXIT', 'HarnessError', 'Skip', 'log',
    'stop_process', 'tail', 'tool_binary', 'wait_until', 'work_directory',
    'Checks', 'answers', 'run_main', 'still_in_flight', 'within',
    'Daemon', 'VmigctlError', 'find_binaries', 'migration_connections', 'parse_linked',
    'run_vmigd', 'status_connections', 'status_field', 'status_migration',
    'status_migration_count', 'status_migrations', 'stop_quietly',
    'DEFAULT_MAX_BANDWIDTH', 'DaemonMigration', 'MigrationResult', 'configure_migration',
    'migrate_direct', 'migrate_via_daemons', 'start_via_daemons', 'verify_memory',
    'wait_failed_at_home', 'wait_migration',
    'NetPair', 'UnixServer', 'digest_all', 'netns_prefix', 'netns_socket', 'peer_closed',
    'read_until_close', 'recv_all', 'wait_closed',
    'REPLY_BAD_VERSION', 'REPLY_DUPLICATE', 'REPLY_MALFORMED', 'REPLY_NOT_THE_PEER', 'REPLY_OK',
    'REPLY_UNKNOWN_KEY', 'REPLY_UNKNOWN_PORT', 'Sniffer', 'TLSProbe', 'node_hop_preamble',
    'plaintext_hits', 'probe_tls_accepted', 'ram_page_prefixes', 'reply_status', 'tls_connect',
    'http_get', 'parse_prometheus', 'prom_value',
    'GUEST_READY', 'QMP', 'GuestReport', 'GuestSpec', 'QMPError', 'Qemu', 'guest_binary',
    'random_ram_file', 'realistic_ram_file', 'zstd_ratio',
    'machine_for', 'qemu_binary', 'qemu_version', 'resolve_qemu', 'side_qemu',
    'RateSample', 'RateWatch', 'backlogged', 'cpu_idle_between', 'flow_span', 'fmt_rates',
    'held_back', 'held_shares', 'qemu_faults_between', 'qemu_pending', 'rate_between',
    'window_rates',
    'StockPeer', 'StockTestbed', 'stockpeer_binary',
    'Testbed',
    'CLIENT_CN', 'CRYPTO_MODES', 'DEFAULT_TLS_ALLOW', 'NODE_CN', 'PKI', 'CertFiles',
    'atomic_write', 'install_tls', 'leaf_until', 'make_pki', 'normalize_serial', 'rotate_tls',
    'shows_serial', 'tls_paths',
]
