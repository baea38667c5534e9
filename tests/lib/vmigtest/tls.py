"""TLS material for the tests: a throw-away PKI made with the openssl CLI, certificate facts
(subject, serial), and installing and rotating a daemon's files the way a file copy or a
Kubernetes secret volume does. Stdlib only."""

import dataclasses
import os
import shutil
import subprocess
import tempfile
import time

from .base import HarnessError, Skip


NODE_CN = 'kubevirt.io:system:node:virt-handler'
CLIENT_CN = 'kubevirt.io:system:client:migration'
DEFAULT_TLS_ALLOW = ['kubevirt.io:system:node:virt-handler',
                     'kubevirt.io:system:client:virt-handler',
                     'kubevirt.io:system:client:migration']
CRYPTO_MODES = ('user-space', 'ktls', 'ktls-tx', 'ktls-rx')     # linked lines' crypto=
TLS_REFUSAL_TOKENS = ('no-certificate', 'untrusted-ca', 'expired', 'not-yet-valid', 'bad-purpose',
                      'name-not-allowed', 'peer-refused', 'protocol', 'closed', 'handshake-timeout')

_OPENSSL_CNF = """\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = unused
[v3_ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
[v3_node]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = serverAuth,clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid,issuer
[v3_serveronly]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = serverAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid,issuer
[v3_client]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid,issuer
[ca]
default_ca = ca_dated
[ca_dated]
database = {dir}/ca-db/index.txt
new_certs_dir = {dir}/ca-db
serial = {dir}/ca-db/serial
default_md = sha256
policy = policy_any
unique_subject = no
copy_extensions = none
email_in_dn = no
[policy_any]
commonName = supplied
"""


@dataclasses.dataclass
class CertFiles:
    """One PEM certificate and its key. serial: lowercase hex without leading zeros (see
    normalize_serial()); ca: the bundle it chains to."""
    name: str
    cert: str
    key: str
    subject: str
    serial: str
    ca: str = None

    def paths(self, ca=None):
        return {'cert': self.cert, 'key': self.key, 'ca': ca or self.ca}


@dataclasses.dataclass
class PKI:
    """What make_pki() made. ca/ca_key: the node CA; node, node2: good node certificates (same
    CN, different keys and serials); client (CN kubevirt.io:system:client:migration, EKU
    clientAuth only: a source's separate client pair); other_ca and rogue (signed by it, right
    CN); expired, not_yet_valid, badname (CN kubevirt.io:system:node:somebody-else), serveronly
    (EKU serverAuth only): signed by the right CA."""
    dir: str
    ca: str
    ca_key: str
    node: CertFiles
    node2: CertFiles
    client: CertFiles
    other_ca: str
    other_ca_key: str
    rogue: CertFiles
    expired: CertFiles
    not_yet_valid: CertFiles
    badname: CertFiles
    serveronly: CertFiles

    def paths(self, which='node', ca=None):
        """{'cert', 'key', 'ca'} for certificate WHICH (default: node, the right CA)."""
        return getattr(self, which).paths(ca)


def _openssl(*args, cwd=None):
    proc = subprocess.run(['openssl', *args], capture_output=True, text=True, timeout=60,
                          cwd=cwd, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise HarnessError(f'openssl {" ".join(args)} exited {proc.returncode}: '
                           f'{proc.stderr.strip()}')
    return proc.stdout


def normalize_serial(text):
    """'0A:1b:...' / '0x0a1b' / '0A1B' -> 'a1b'."""
    text = text.strip().lower()
    if text.startswith('0x'):
        text = text[2:]
    return text.replace(':', '').lstrip('0') or '0'


def shows_serial(text, serial):
    """Whether text shows the (normalized) serial, in any case, with or without colons."""
    return serial in str(text).lower().replace(':', '')


def cert_info(path):
    """{'subject', 'serial' (normalized), 'not_before', 'not_after'} of a PEM certificate."""
    out = _openssl('x509', '-in', path, '-noout', '-subject', '-serial', '-startdate', '-enddate',
                   '-nameopt', 'RFC2253')
    info = {}
    for line in out.splitlines():
        name, _, value = line.partition('=')
        info[name.strip()] = value.strip()
    return {'subject': info.get('subject', ''), 'serial': normalize_serial(info.get('serial', '')),
            'not_before': info.get('notBefore'), 'not_after': info.get('notAfter')}


def _new_serial():
    # 63 bits with the top one set: positive, and no leading zero to normalize away.
    return f'{int.from_bytes(os.urandom(8), "big") >> 1 | 1 << 62:x}'


def make_pki(directory, days=30):
    """Make a PKI under directory with the openssl CLI (ECDSA P-256 keys, like KubeVirt's); about
    a dozen openssl runs, well under a second. Returns a PKI; Skip without the openssl CLI."""
    if shutil.which('openssl') is None:
        raise Skip('the openssl command-line tool is not installed (it makes the test PKI)')
    os.makedirs(os.path.join(directory, 'ca-db'), exist_ok=True)
    cnf = os.path.join(directory, 'openssl.cnf')
    with open(cnf, 'w') as f:
        f.write(_OPENSSL_CNF.format(dir=directory))
    open(os.path.join(directory, 'ca-db', 'index.txt'), 'w').close()

    def key(name):
        path = os.path.join(directory, f'{name}.key')
        _openssl('genpkey', '-algorithm', 'EC', '-pkeyopt', 'ec_paramgen_curve:P-256',
                 '-out', path)
        os.chmod(path, 0o600)
        return path

    def make_ca(name, cn):
        k = key(name)
        crt = os.path.join(directory, f'{name}.crt')
        _openssl('req', '-config', cnf, '-x509', '-new', '-key', k, '-subj', f'/CN={cn}',
                 '-days', str(days), '-sha256', '-extensions', 'v3_ca', '-set_serial',
                 '0x' + _new_serial(), '-out', crt)
        os.chmod(crt, 0o644)   # whatever the umask: vmigd refuses a file others can write
        return crt, k

    def leaf(name, cn, ca, ca_key, ext='v3_node', dates=None):
        k = key(name)
        csr = os.path.join(directory, f'{name}.csr')
        crt = os.path.join(directory, f'{name}.crt')
        serial = _new_serial()
        _openssl('req', '-config', cnf, '-new', '-key', k, '-subj', f'/CN={cn}', '-out', csr)
        if dates is None:
            _openssl('x509', '-req', '-in', csr, '-CA', ca, '-CAkey', ca_key, '-set_serial',
                     '0x' + serial, '-days', str(days), '-sha256', '-extfile', cnf,
                     '-extensions', ext, '-out', crt)
        else:                  # openssl x509 -req of OpenSSL 3.0 cannot set the dates; ca can
            with open(os.path.join(directory, 'ca-db', 'serial'), 'w') as f:
                f.write(serial.upper().zfill(16) + '\n')
            _openssl('ca', '-batch', '-config', cnf, '-name', 'ca_dated', '-cert', ca, '-keyfile',
                     ca_key, '-in', csr, '-out', crt, '-startdate', dates[0], '-enddate',
                     dates[1], '-extensions', ext, '-notext', '-preserveDN')
        os.unlink(csr)
        os.chmod(crt, 0o644)
        info = cert_info(crt)
        if info['serial'] != serial:
            raise HarnessError(f'{crt}: serial {info["serial"]}, meant {serial}')
        return CertFiles(name, crt, k, info['subject'], info['serial'], ca)

    ca, ca_key = make_ca('ca', f'kubevirt.io@{int(time.time())}')
    other_ca, other_ca_key = make_ca('other-ca', 'some-other-ca@1')
    pki = PKI(
        dir=directory, ca=ca, ca_key=ca_key,
        node=leaf('node', NODE_CN, ca, ca_key),
        node2=leaf('node2', NODE_CN, ca, ca_key),
        client=leaf('client', CLIENT_CN, ca, ca_key, ext='v3_client'),
        other_ca=other_ca, other_ca_key=other_ca_key,
        rogue=leaf('rogue', NODE_CN, other_ca, other_ca_key),
        expired=leaf('expired', NODE_CN, ca, ca_key,
                     dates=('20200101000000Z', '20200102000000Z')),
        not_yet_valid=leaf('not-yet-valid', NODE_CN, ca, ca_key,
                           dates=('20990101000000Z', '20990201000000Z')),
        badname=leaf('badname', 'kubevirt.io:system:node:somebody-else', ca, ca_key),
        serveronly=leaf('serveronly', NODE_CN, ca, ca_key, ext='v3_serveronly'))
    return pki


def leaf_until(pki, name, not_after):
    """A node certificate NAME (NODE_CN, signed by pki's CA) valid from an hour ago until
    not_after (Unix seconds, whole): one that expires while a test watches. A CertFiles."""
    directory = pki.dir
    stamp = lambda t: time.strftime('%Y%m%d%H%M%SZ', time.gmtime(t))  # noqa: E731
    k = os.path.join(directory, f'{name}.key')
    csr = os.path.join(directory, f'{name}.csr')
    crt = os.path.join(directory, f'{name}.crt')
    cnf = os.path.join(directory, 'openssl.cnf')
    serial = _new_serial()
    _openssl('genpkey', '-algorithm', 'EC', '-pkeyopt', 'ec_paramgen_curve:P-256', '-out', k)
    os.chmod(k, 0o600)
    _openssl('req', '-config', cnf, '-new', '-key', k, '-subj', f'/CN={NODE_CN}', '-out', csr)
    with open(os.path.join(directory, 'ca-db', 'serial'), 'w') as f:
        f.write(serial.upper().zfill(16) + '\n')
    _openssl('ca', '-batch', '-config', cnf, '-name', 'ca_dated', '-cert', pki.ca, '-keyfile',
             pki.ca_key, '-in', csr, '-out', crt, '-startdate', stamp(time.time() - 3600),
             '-enddate', stamp(not_after), '-extensions', 'v3_node', '-notext', '-preserveDN')
    os.unlink(csr)
    os.chmod(crt, 0o644)
    info = cert_info(crt)
    return CertFiles(name, crt, k, info['subject'], info['serial'], pki.ca)


def tls_paths(tls):
    """A dict with 'cert', 'key', 'ca' (and optionally 'client_cert', 'client_key') from a dict,
    a PKI (its node certificate and CA), or anything with .cert, .key and .ca."""
    if isinstance(tls, dict):
        paths = dict(tls)
    elif isinstance(tls, PKI):
        paths = tls.paths('node')
    else:
        paths = {'cert': tls.cert, 'key': tls.key, 'ca': tls.ca}
    for name in ('cert', 'key', 'ca'):
        if not paths.get(name):
            raise HarnessError(f'TLS configuration without {name}: {paths}')
    return paths


def atomic_write(path, data, mode=0o600):
    """Write data (bytes or str) to a temporary file in path's directory and rename it over path,
    so that a reader sees the old file or the new one, never a half-written one."""
    if isinstance(data, str):
        data = data.encode()
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=f'.{os.path.basename(path)}.')
    try:
        with os.fdopen(fd, 'wb') as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.rename(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _read(path):
    with open(path, 'rb') as f:
        return f.read()


TLS_FILE_NAMES = {'cert': 'tls.crt', 'key': 'tls.key', 'ca': 'ca.crt'}


def install_tls(directory, certfiles, ca, layout='files'):
    """Copy a certificate, its key and the CA into directory as tls.crt, tls.key and ca.crt;
    returns their paths as a dict. layout 'files': plain files. layout 'kubernetes': what the
    kubelet makes of a secret volume, tls.crt -> ..data/tls.crt, ..data -> ..TIMESTAMP/ (a
    directory holding the real files), so rotate_tls() can swap every file with one rename."""
    os.makedirs(directory, exist_ok=True)
    contents = {'cert': _read(certfiles.cert), 'key': _read(certfiles.key), 'ca': _read(ca)}
    if layout == 'files':
        for name, data in contents.items():
            atomic_write(os.path.join(directory, TLS_FILE_NAMES[name]), data)
    elif layout == 'kubernetes':
        _kube_swap(directory, contents)
        for name in TLS_FILE_NAMES.values():
            link = os.path.join(directory, name)
            if not os.path.islink(link):
                os.symlink(os.path.join('..data', name), link)
    else:
        raise HarnessError(f'unknown TLS file layout {layout!r}')
    return {name: os.path.join(directory, TLS_FILE_NAMES[name]) for name in contents}


def _kube_swap(directory, contents):
    """The kubelet's AtomicWriter: the files in a new ..TIMESTAMP directory, a ..data_tmp symlink
    to it renamed over ..data, then the old directory removed."""
    stamp = tempfile.mkdtemp(dir=directory, prefix=time.strftime('..%Y_%m_%d_%H_%M_%S.'))
    for name, data in contents.items():
        # 0600 like a kubelet's file on a writable test directory: vmigd forgives a key others
        # can read only on a read-only mount (the real secret volume).
        fd = os.open(os.path.join(stamp, TLS_FILE_NAMES[name]), os.O_WRONLY | os.O_CREAT, 0o600)
        with os.fdopen(fd, 'wb') as f:
            f.write(data)
    data_link = os.path.join(directory, '..data')
    old = os.readlink(data_link) if os.path.islink(data_link) else None
    tmp_link = os.path.join(directory, '..data_tmp')
    if os.path.lexists(tmp_link):
        os.unlink(tmp_link)
    os.symlink(os.path.basename(stamp), tmp_link)
    os.rename(tmp_link, data_link)
    if old:
        shutil.rmtree(os.path.join(directory, old), ignore_errors=True)


def rotate_tls(directory, certfiles=None, ca=None, layout='files', key_data=None,
               cert_data=None):
    """Replace what install_tls() put in directory, the way a secret update does: with layout
    'files' each changed file is written to a temporary file and renamed over the old one (the
    key first, then the certificate, then the CA); with 'kubernetes' all of them at once with one
    rename of ..data. certfiles: new certificate and key (None: keep them); ca: a new CA file;
    key_data/cert_data: raw contents instead (e.g. garbage)."""
    contents = {name: _read(os.path.join(directory, TLS_FILE_NAMES[name]))
                for name in ('cert', 'key', 'ca')}
    new = {}
    if certfiles is not None:
        new['key'], new['cert'] = _read(certfiles.key), _read(certfiles.cert)
    if key_data is not None:
        new['key'] = key_data if isinstance(key_data, bytes) else key_data.encode()
    if cert_data is not None:
        new['cert'] = cert_data if isinstance(cert_data, bytes) else cert_data.encode()
    if ca is not None:
        new['ca'] = _read(ca)
    if layout == 'kubernetes':
        contents.update(new)
        _kube_swap(directory, contents)
    else:
        for name in ('key', 'cert', 'ca'):
            if name in new:
                atomic_write(os.path.join(directory, TLS_FILE_NAMES[name]), new[name])
