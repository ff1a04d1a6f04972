"""A real SMTP server for the email sink's tests (aiosmtpd): listens on 127.0.0.1:<port>,
writes each accepted message to <dir>/<n>.eml, refuses recipients at nowhere.invalid with 550
and busy@ recipients with 451. With <cert> <key>, it requires STARTTLS before MAIL. Prints
READY, then runs until stdin closes."""
import asyncio, pathlib, ssl, sys
from aiosmtpd.controller import Controller

port, out = int(sys.argv[1]), pathlib.Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)

class Handler:
    def __init__(self):
        self.n = 0
    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        if address.endswith("@nowhere.invalid"):
            return "550 5.1.1 no such user"
        if address.startswith("busy@"):
            return "451 4.3.0 try again later"
        envelope.rcpt_tos.append(address)
        return "250 OK"
    async def handle_DATA(self, server, session, envelope):
        self.n += 1
        head = f"X-Envelope-From: {envelope.mail_from}\nX-Envelope-To: {','.join(envelope.rcpt_tos)}\n"
        (out / f"{self.n}.eml").write_bytes(head.encode() + envelope.content)
        return "250 Message accepted for delivery"

tls = {}
if len(sys.argv) > 4:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(sys.argv[3], sys.argv[4])
    tls = {"tls_context": ctx, "require_starttls": True}
c = Controller(Handler(), hostname="127.0.0.1", port=port, **tls)
c.start()
print("READY", flush=True)
sys.stdin.read()
c.stop()
