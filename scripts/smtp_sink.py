#!/usr/bin/env python3
"""A real SMTP server for the email tests (aiosmtpd): listens on 127.0.0.1:PORT, offers
STARTTLS with a self-signed certificate made at the first start (DIR/cert.pem, valid for
localhost and 127.0.0.1; kept when restarted on the same DIR), optionally requires it and a login, and stores every message it accepts as
DIR/msg-N.json: {"mail_from", "rcpt_tos", "login", "tls", "data"}.

    python3 scripts/smtp_sink.py --port PORT --dir DIR [--require-tls] [--user U --password P]

Prints `SMTP_READY PORT` once it accepts connections; stops on SIGTERM or SIGINT.
Needs `python3 -m pip install aiosmtpd` and the openssl command.
"""

import argparse
import json
import os
import signal
import ssl
import subprocess
import threading

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword


def make_cert(folder):
    """Makes the certificate once; a restart in the same folder keeps it."""
    cert, key = os.path.join(folder, "cert.pem"), os.path.join(folder, "key.pem")
    if not (os.path.exists(cert) and os.path.exists(key)):
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
             "-keyout", key, "-out", cert, "-subj", "/CN=localhost",
             "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
             "-addext", "basicConstraints=critical,CA:FALSE",
             "-addext", "extendedKeyUsage=serverAuth"],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    return ctx


class Store:
    def __init__(self, folder):
        self.folder = folder
        # A restart on the same folder numbers on after the stored messages.
        self.n = len([f for f in os.listdir(folder) if f.startswith("msg-")])
        self.lock = threading.Lock()

    async def handle_DATA(self, server, session, envelope):
        with self.lock:
            self.n += 1
            n = self.n
        record = {
            "mail_from": envelope.mail_from,
            "rcpt_tos": envelope.rcpt_tos,
            "login": session.auth_data.login.decode() if isinstance(session.auth_data, LoginPassword) else None,
            "tls": session.ssl is not None,
            "data": envelope.original_content.decode("utf-8", "replace"),
        }
        tmp = os.path.join(self.folder, f".msg-{n}.json")
        with open(tmp, "w") as f:
            json.dump(record, f)
        # Renamed into place, so a reader never sees half a file.
        os.rename(tmp, os.path.join(self.folder, f"msg-{n}.json"))
        return "250 Message accepted for delivery"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--dir", required=True)
    p.add_argument("--require-tls", action="store_true")
    p.add_argument("--user")
    p.add_argument("--password")
    a = p.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    ctx = make_cert(a.dir)

    def authenticate(server, session, envelope, mechanism, auth_data):
        ok = isinstance(auth_data, LoginPassword) and auth_data.login.decode() == a.user and auth_data.password.decode() == a.password
        return AuthResult(success=ok, handled=False, auth_data=auth_data)

    kwargs = {}
    if a.user:
        kwargs.update(authenticator=authenticate, auth_required=True, auth_require_tls=True)
    c = Controller(Store(a.dir), hostname="127.0.0.1", port=a.port, tls_context=ctx, require_starttls=a.require_tls, **kwargs)
    c.start()
    print(f"SMTP_READY {a.port}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    c.stop()


if __name__ == "__main__":
    main()
