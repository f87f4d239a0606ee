"""One way to fail: the errors a user can fix.

A ``UserError`` is a problem with the user's config, files, model or machine, and its message says
what to do about it; the CLI prints that one line and exits with status 2. Anything else is a bug and
propagates with its traceback. Bad input from peers is not a user error: the network edge rejects
and counts it (``swarmnode.swarm.wire.limits.ProtocolError``, ``PeerError``) and keeps going.
"""

from __future__ import annotations


class UserError(Exception):
    """A problem the user can fix; the message names the field, file or setting and what to change."""


class ConfigError(UserError):
    """A config problem; the message names the field and the file."""


class PolicyError(UserError):
    """A model or tokenizer problem; the message says what is wrong and how to fix it."""


class TaskError(UserError, ValueError):
    """A task mix or task ref this node cannot use; the message names the offending field."""


class StatusError(UserError):
    """Nothing to show: the message says where we looked."""


class TransportError(UserError):
    """The network could not start or was misused (a port taken, a bad identity or address, a clock off);
    ``reason`` is a short snake_case label."""

    def __init__(self, reason: str, message: str = ""):
        self.reason = reason
        super().__init__(f"{reason}: {message}" if message else reason)


class PeerError(Exception):
    """A peer failed this node at the network edge (a pull timed out, was refused, sent too much): not the
    user's to fix and never fatal; the caller counts ``reason`` (``net.transport.FETCH_FAILURE_REASONS``)
    and goes on."""

    def __init__(self, reason: str, message: str = ""):
        self.reason = reason
        super().__init__(f"{reason}: {message}" if message else reason)
