"""The master's CURVE key pair: written by ``c4d keygen DIR``, read by ``c4d master --curve DIR``.

With CURVE (ZeroMQ's CurveZMQ: Curve25519 key exchange, every message encrypted and
authenticated) a rank completes its handshake only if it holds the master's public key; it
makes its own key pair per process (the shim calls ``zmq_curve_keypair``), so the master's
public key is what admits a sender: hand it to the job like a secret (``C4D_CURVE_SERVER_KEY``,
a file of mode 0600 or the key's 40 Z85 characters), and keep the secret key on the master's
host. Both files are ZeroMQ certificates (the format ``zmq.auth`` reads) created with mode 0600;
``load`` refuses a secret key that other users can read, as ssh does.
"""

from __future__ import annotations

import datetime
import os
import stat
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth

PUBLIC = "master.key"
SECRET = "master.key_secret"


class CurveKeyError(ValueError):
    """Keys that can't be made or used; the message is one line for the operator."""


@dataclass(frozen=True)
class Keys:
    public: bytes  # Z85, 40 bytes
    secret: bytes
    public_file: Path


def available() -> bool:
    """Whether this pyzmq's libzmq was built with CURVE."""
    return bool(zmq.has("curve"))


def _cert(public: str, secret: str | None) -> str:
    kind = "Secret" if secret else "Public"
    lines = [
        f"#   ****  Generated on {datetime.datetime.now():%Y-%m-%d %H:%M:%S} by c4d keygen  ****",
        f"#   ZeroMQ CURVE {kind} Certificate of a c4d master",
        "#   Exchange securely, or stay private",
        "",
        "metadata",
        "curve",
        f'    public-key = "{public}"',
    ]
    if secret:
        lines.append(f'    secret-key = "{secret}"')
    return "\n".join(lines) + "\n"


def _write_private(path: Path, text: str) -> None:
    """Create ``path`` with mode 0600 from the first byte on (never widened, never overwritten)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)  # whatever the umask
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def generate(key_dir: str | os.PathLike) -> tuple[Path, Path]:
    """A new key pair in ``key_dir`` (created 0700 when missing); (public file, secret file)."""
    if not available():
        raise CurveKeyError("this pyzmq's libzmq has no CURVE support (zmq.has('curve') is False)")
    d = Path(key_dir)
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    pub_f, sec_f = d / PUBLIC, d / SECRET
    for f in (pub_f, sec_f):
        if f.exists() or f.is_symlink():
            raise CurveKeyError(f"{f} exists: not overwriting a key the job may use (remove it first)")
    public, secret = (k.decode() for k in zmq.curve_keypair())
    _write_private(sec_f, _cert(public, secret))
    _write_private(pub_f, _cert(public, None))
    return pub_f, sec_f


def load(key_dir: str | os.PathLike) -> Keys:
    """The master's key pair from ``key_dir``; CurveKeyError with one line when unusable."""
    if not available():
        raise CurveKeyError("--curve: this pyzmq's libzmq has no CURVE support (zmq.has('curve') is False)")
    d = Path(key_dir)
    sec_f = d / SECRET
    try:
        st = sec_f.stat()
    except FileNotFoundError:
        raise CurveKeyError(f"--curve {d}: no {SECRET} there (make one with: c4d keygen {d})") from None
    except OSError as e:
        raise CurveKeyError(f"--curve {d}: {e.strerror or e}") from None
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise CurveKeyError(
            f"--curve: {sec_f} has mode {stat.S_IMODE(st.st_mode):04o}: other users can read the master's "
            f"secret key; run chmod 600 {sec_f}"
        )
    try:
        public, secret = zmq.auth.load_certificate(sec_f)
    except (OSError, ValueError) as e:
        raise CurveKeyError(f"--curve: {sec_f} is not a ZeroMQ certificate: {e}") from None
    try:
        paired = secret is not None and len(public) == 40 and zmq.curve_public(secret) == public
    except (zmq.ZMQError, ValueError):
        paired = False
    if not paired or secret is None:
        raise CurveKeyError(
            f"--curve: {sec_f} holds no matching public-key and secret-key (40 Z85 characters each)"
        )
    return Keys(public=public, secret=secret, public_file=d / PUBLIC)


def server_key(value: str) -> bytes:
    """A master's public key as a client needs it: 40 Z85 characters, or a certificate file
    (``c4d keygen``)."""
    if len(value) == 40 and not os.path.exists(value):
        return value.encode()
    public, _ = zmq.auth.load_certificate(value)
    if not public or len(public) != 40:
        raise ValueError(f"{value}: no public key in it")
    return public
