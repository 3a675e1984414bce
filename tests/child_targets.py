"""Functions tests run in child processes (optimize.system.child) and in backend workers: a module of
their own, importing only the standard library and optimize.errors, so that a child starts quickly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

from optimize import errors
from optimize.errors import InputError
from optimize.system.child import ParentLink

# A grandchild that ignores SIGTERM: only the SIGKILL after the grace period ends it.
_STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"


class NotInErrors(InputError):
    """An lto error defined outside optimize.errors: it crosses as the InputError it is."""


class Declined(Exception):
    """A caller's own exception type, rebuilt by name when the caller names it as known."""


def talk_then_answer(link: ParentLink, value: int) -> int:
    link.progress(("warming up", 1, 0.5))
    link.log("a log line")
    link.status("a status line")
    return value * 2


def raise_lto_error(link: ParentLink, class_name: str, message: str, hint: str | None) -> None:
    raise getattr(errors, class_name)(message, hint)


def raise_not_in_errors(link: ParentLink) -> None:
    raise NotInErrors("bad input", "pin it with --shape")


def raise_foreign(link: ParentLink) -> None:
    raise ValueError("a bad value\nand pages more from a native library")


def raise_declined(link: ParentLink) -> None:
    raise Declined("does not apply")


def return_unpicklable(link: ParentLink) -> Any:
    return lambda: None


def kill_self(link: ParentLink, signum: int) -> None:
    os.kill(os.getpid(), signum)
    time.sleep(60)  # the signal ends it first


def exit_with_last_words(link: ParentLink, code: int) -> None:
    print("noise: Scope Loaded", file=sys.stderr)
    print("the last words", file=sys.stderr)
    print("noise: Scope Loaded", file=sys.stderr, flush=True)
    os._exit(code)


def survive_sigint(link: ParentLink) -> str:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.2)  # time for a handler, if there were one, to run
    return "still here"


def process_ids(link: ParentLink) -> tuple[int, int, int]:
    return os.getpid(), os.getpgid(0), os.getsid(0)


def sleep(link: ParentLink, seconds: float) -> None:
    time.sleep(seconds)


def start_stubborn_workers(link: ParentLink, count: int) -> None:
    """Start `count` grandchildren that ignore SIGTERM, say their ids, ignore SIGTERM too, wait."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    workers = [subprocess.Popen([sys.executable, "-c", _STUBBORN]) for _ in range(count)]
    link.progress([w.pid for w in workers])
    time.sleep(120)


def die_with_channel_held_open(link: ParentLink) -> None:
    """Exit while a grandchild holds the channel open: the parent sees no end-of-file, only
    that this process is gone."""
    fd = link.connection.fileno()
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], pass_fds=(fd,))
    link.progress(worker.pid)
    os._exit(7)


def sleep_in_worker(backend: object, seconds: float) -> str:
    """For SubprocessBackend.call_in_child: a request that keeps the worker busy."""
    time.sleep(seconds)
    return "slept"
