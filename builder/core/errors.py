"""Errors a user can act on, and the one exit-code table every command uses."""

# The exit codes of every builder command (`builder --help` and README show this table).
EXIT_CODES = {
    "ok": 0,  # done; for wait-ready: ready, generation works, the backends match
    "ready": 0,
    "error": 1,  # bad input or a failed step: one line names the file, setting or step
    "internal": 2,  # a bug in builder: rerun with --debug for the traceback
    "crashed": 3,  # wait-ready: the container exited, restarted or was removed
    "timeout": 4,  # wait-ready: the deadline passed while the server was still starting
    "mismatch": 5,  # wait-ready: up, but /server_info shows other backends than asked for
    "stalled": 6,  # wait-ready: no new log line for --stall-minutes before ready
    # patches check/refresh, upstream check/move: the series (or a profile, the JIT list, the
    # lock) cannot move to the new upstream unattended
    "drift": 7,
    "unqualified": 8,  # qualify: a check failed or partial (the receipt says); a sweep chose none
    "unreachable": 9,  # could not check: a daemon, registry, index or remote did not answer
    "interrupted": 130,  # Ctrl-C: the cache is consistent, run the command again
    "pipe_closed": 141,  # `builder … | head`: the reader stopped reading (128 + SIGPIPE)
}

EXIT_CODES_HELP = """\
exit codes:
  0    ok (wait-ready: ready, a generation worked, the backends match)
  1    bad input or a failed step; the one-line error names the file, setting or step
  2    internal error (a bug): rerun with --debug for the traceback
  3    wait-ready: crashed (the container exited, restarted or is gone)
  4    wait-ready: still starting when the deadline passed (not a crash)
  5    wait-ready: up, but /server_info shows other backends than the profile asked for
  6    wait-ready: stalled (no new log line for --stall-minutes before ready)
  7    patches check/refresh, upstream check/move: the series cannot move to that upstream
       unattended (upstream: or a profile flag, a JIT generator, the lock needs review)
  8    qualify: a check failed (verify, start-up, correctness or throughput: see the
       receipt), or partial: verify, the backends or throughput did not run
       (--allow-partial exits 0); qualify --sweep: no profile passed every gate
  9    could not check: the Docker daemon, a registry, an index, a git remote or the
       Hugging Face hub did not answer (nothing was found wrong; 1 means a check ran and
       found a problem)
  130  interrupted (the cache stays consistent)
  141  the output's reader stopped reading (`| head`); nothing else went wrong
With --json, stdout holds one JSON object on failure too: {"ok": false, "error": MESSAGE,
"exit_code": CODE}.
"""


class BuilderError(Exception):
    """A failure with a message that names the file, patch or setting at fault."""


class Unreachable(BuilderError):
    """Could not check: a daemon, registry, index or git remote did not answer (exit 9)."""
