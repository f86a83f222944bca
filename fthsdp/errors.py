"""The runtime's one error model: every error it raises on purpose is one of two kinds, or
one of two endings that are not errors of the run (below).

- `Recoverable`: this step cannot commit. Inside the runtime it becomes this rank's "no"
  vote (or a refused plan); the step is retried, and only after `max_retries` failed steps
  in a row does it turn into a `Fatal` error. It never reaches the training script.
- `Fatal`: the runtime cannot go on. It is raised to the training script with a message
  that says what to do (usually: exit non-zero, so the agent restarts the replica and it
  catches up from a healthy one).

The two endings are neither kind:
- `ReplicaFinished`: the replica has no more steps (`max_steps` reached, a rank closed, or
  the job is COMPLETED). `Manager.batches()` turns it into the end of the loop.
- `JobCompleted`: the controller refused a quorum because the job is COMPLETED; the replica's
  coordinator turns it into the replica's end (every rank then sees `ReplicaFinished`). A
  process that had committed no step when it learned the end (it started, or torchrun
  restarted it, after the job COMPLETED, early or late) gets the `Fatal` `JobAlreadyCompleted`
  instead: it trained nothing.

Two `Fatal` errors mean "nothing will change if you restart": `JobAlreadyCompleted`, and a
`ConfigurationError` (no job secret, a job secret that differs from the controller's, a replica
id the controller refuses, invalid settings). A training script exits with the status named
below for each (examples/train_gpt.py does, `exit_status` maps an error to it), so that a
launcher can tell them from a crash: under torchrun, which restarts every non-zero exit up to
--max-restarts, a rank that exits EXIT_CONFIGURATION_ERROR fails the same way each time.
"""

from __future__ import annotations

#: The exit status of a replica's process that started (or was restarted) after the job
#: COMPLETED: nothing to train, nothing written (JobAlreadyCompleted).
EXIT_JOB_ALREADY_COMPLETED = 3
#: The exit status of a process whose configuration can never work (ConfigurationError):
#: sysexits.h's EX_CONFIG. Do not restart on it; fix the settings.
EXIT_CONFIGURATION_ERROR = 78


class RuntimeFailure(Exception):
    """Base of every error the trainer runtime raises on purpose."""


class Recoverable(RuntimeFailure):
    """This step cannot commit; it is retried within the retry budget."""


class Fatal(RuntimeFailure):
    """The runtime cannot go on; the message says what to do."""


class RetryLimitExceeded(Fatal):
    """More than `max_retries` steps in a row failed to commit; the replica gives up."""


class ChannelError(Recoverable):
    """The connection to the replica's coordinator failed: a peer vanished, a frame was bad."""


class TransferError(Recoverable):
    """A catch-up transfer was refused, cut short, malformed or failed its checksum."""


class PlanError(Recoverable):
    """A quorum answer does not fit this rank (it votes no; the next quorum may fit)."""


class ControllerUnavailable(Recoverable):
    """No controller address answered within the deadline (a failover, a restart)."""


class ControllerRefused(Fatal):
    """The controller refused a request for good (another job, a fenced host, bad input)."""


class ConfigurationError(Fatal):
    """This process's configuration can never work: restarting it changes nothing; the message
    says what to fix. Exit with EXIT_CONFIGURATION_ERROR."""


class InvalidSettings(ConfigurationError, ValueError):
    """RuntimeSettings (or their environment) are invalid or incomplete (no job secret): the
    message names the bad value. A ValueError too."""


class ControllerRefusedConfiguration(ControllerRefused, ConfigurationError):
    """The controller refused who this replica says it is, for good: its job secret differs from
    the controller's (PERMISSION_DENIED), or its replica id, job id or shape is not the job's."""


class ControllerUnreachable(ControllerRefused):
    """No controller answered any call for connect_timeout_s (a wrong address, a controller
    that is gone): the replica gives up, as an agent does after --connect-timeout-s."""


class JobFailed(ControllerRefused):
    """The controller refused a quorum because the job is FAILED (no replica could make
    progress for its fail_after_s): final; the trainer ends with this error."""


class JobCompleted(RuntimeFailure):
    """The controller refused a quorum because the job is COMPLETED: nothing left to train."""


class JobAlreadyCompleted(Fatal):
    """This replica started after the job COMPLETED: its first quorum was refused before it
    trained anything. There is nothing to train; a script should write no results and exit
    non-zero (examples/train_gpt.py: exit status 3)."""


class CheckpointError(Recoverable):
    """A checkpoint could not be written or read; the message says where and why.
    A failed write is logged and training goes on; a failed restore is raised as Fatal."""


class ReplicaFinished(Exception):
    """This replica has no more steps to train: leave the training loop and call close()."""


def exit_status(error: BaseException) -> int:
    """The exit status a training script ends with for `error`: EXIT_JOB_ALREADY_COMPLETED,
    EXIT_CONFIGURATION_ERROR, or 1 for anything else."""
    if isinstance(error, JobAlreadyCompleted):
        return EXIT_JOB_ALREADY_COMPLETED
    if isinstance(error, ConfigurationError):
        return EXIT_CONFIGURATION_ERROR
    return 1
