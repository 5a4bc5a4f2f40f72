"""A nameserver that answers one name two ways: SECURITY.md 32's attacker (the fifth
security review's second attack), who answers the launcher's DNS. It serves `records`
(name → IPv4 address) over UDP on `listen`:53, and for `name` the true address to the
first A query only;
every later A query for it gets `then` (the launcher's own address), as a stale record
or a racing answer would give mpirun, which resolves after the agent. Other names:
NXDOMAIN; AAAA and the rest: no data.

    python -m tests.support.twofaced LISTEN NAME THEN RECORDS_JSON

Run in the launcher pod's network namespace (its resolv.conf pointed at it); prints
`ready` once it listens, and one line per answer to `name` (`A <address>`).
"""

from __future__ import annotations

import json
import socket
import sys

import dns.flags
import dns.message
import dns.rcode
import dns.rdatatype
import dns.rrset


def main(listen: str, name: str, then: str, records: dict[str, str]) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((listen, 53))
    print("ready", flush=True)
    asked = 0
    while True:
        data, peer = sock.recvfrom(4096)
        try:
            query = dns.message.from_wire(data)
            question = query.question[0]
        except Exception:  # noqa: S112 - not a query: no answer
            continue
        reply = dns.message.make_response(query)
        reply.flags |= dns.flags.AA
        asked_for = question.name.to_text().rstrip(".")
        if asked_for not in records:
            reply.set_rcode(dns.rcode.NXDOMAIN)
        elif question.rdtype == dns.rdatatype.A:
            address = records[asked_for]
            if asked_for == name:
                asked += 1
                address = address if asked == 1 else then
                print(f"A {address}", flush=True)
            reply.answer.append(dns.rrset.from_text(question.name, 5, "IN", "A", address))
        sock.sendto(reply.to_wire(), peer)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4]))
