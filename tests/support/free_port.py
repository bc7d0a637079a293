#!/usr/bin/env python3
"""Prints a TCP port on 127.0.0.1 that is free now, for a test job's rendezvous.

The port is drawn at random below the kernel's ephemeral range (ip_local_port_range), not
found by binding port 0. bind(0) hands out an ephemeral port, and any outgoing connection on
the machine (another test's Gloo mesh, say) may take that as its source port before our rank
0 listens on it. A port below the range is only ever taken by someone who asks for it by
number. spawn_ranks.h's free_port() does the same for the C++ suites."""
import random
import socket


def ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def main():
    low = ephemeral_low()
    for _ in range(200):
        port = random.randint(10000, low - 1) if low > 10001 else 0
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            print(s.getsockname()[1])
            return


main()
