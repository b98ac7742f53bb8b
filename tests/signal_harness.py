"""Run ``dpopt`` and stop at one phase, for the signal tests of ``tests/test_bad_inputs.py``.

    python tests/signal_harness.py PHASE -- dpopt arguments...

At PHASE the process prints ``READY PHASE`` on stdout and sleeps, so the test can send a real
signal exactly then. Phases: ``load`` (reading the data), ``constraints``, ``algorithm``
(noise drawn, solving), ``report``, ``write`` (inside the temporary directory, after the
first file), ``commit`` (while the temporary directory replaces the target: the
handled signals are held there, so the sleep is short and the signal lands after it).
Not a test module: the tests start it as a subprocess.
"""

from __future__ import annotations

import functools
import signal
import sys
import time


def _announce(phase: str, seconds: float):
    def wrap(function):
        @functools.wraps(function)
        def paused(*args, **kwargs):
            result = None
            if phase == "write":  # let one file land in the temporary directory first
                result = function(*args, **kwargs)
            print(f"READY {phase}", flush=True)
            time.sleep(seconds)
            return result if phase == "write" else function(*args, **kwargs)

        return paused

    return wrap


def main() -> int:
    phase = sys.argv[1]
    argv = sys.argv[sys.argv.index("--") + 1:]
    # The harness plays a run at a terminal. A test run started as a background job inherits
    # SIGINT ignored (shells ignore it for background commands), which dpopt rightly keeps.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # Likewise SIGHUP: a suite started under nohup inherits it ignored (kept across exec), and dpopt
    # rightly leaves an ignored signal alone, so the SIGHUP case would sleep through every file.
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    import dpopt.atomic as atomic
    import dpopt.release.outputs as outputs
    import dpopt.release.pipeline as pipeline
    import dpopt.report as report

    long = 60.0
    targets = {
        "load": (pipeline, "load_data"), "constraints": (pipeline, "build_constraints"),
        "algorithm": (pipeline, "run_algorithm"), "report": (report, "build_report"),
        "write": (outputs, "_write_csv"), "commit": (atomic, "_commit"),
    }
    module, name = targets[phase]  # every one is looked up on its module when called
    setattr(module, name, _announce(phase, 1.0 if phase == "commit" else long)(getattr(module, name)))
    from dpopt.cli import main as dpopt_main

    return dpopt_main(argv)


if __name__ == "__main__":
    sys.exit(main())
