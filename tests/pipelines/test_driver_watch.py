"""A Ray task dies with its driver (pipelines/driver_watch.py): the watchdog ends the worker process
when the driver is gone, and a pid reused by another process does not pass for the driver."""

import os
import socket
import subprocess
import sys
import time

from pipelines.driver_watch import Driver, process_start_ticks

# Stands for a Ray worker: runs a 10-minute "task" through run_watched, watching the pid in argv.
WORKER = ("import sys, time; from pipelines.driver_watch import Driver, process_start_ticks, run_watched\n"
          "pid = int(sys.argv[1])\n"
          "run_watched(Driver(pid, process_start_ticks(pid), sys.argv[2]), time.sleep, 600)\n")


def test_the_task_ends_when_its_driver_is_killed():
    driver = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    worker = subprocess.Popen([sys.executable, "-c", WORKER, str(driver.pid), socket.gethostname()],
                              stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(1.0)
        assert worker.poll() is None, worker.stderr.read()  # the driver lives: the task goes on
        driver.kill()
        t0 = time.monotonic()
        # Generous: the machine is shared; without the watchdog the worker sleeps 10 minutes.
        worker.wait(timeout=60)
        took = time.monotonic() - t0
    finally:
        driver.kill()
        worker.kill()
        driver.wait()
    assert worker.returncode == 1
    assert f"driver process {driver.pid} is gone: stopping this task" in worker.stderr.read()
    print(f"task ended {took:.3f} s after its driver")


def test_a_reused_pid_is_not_the_driver():
    me = Driver.this_process()
    assert me.alive() and me.start_ticks == process_start_ticks(os.getpid())
    assert not Driver(me.pid, (me.start_ticks or 0) + 12345, me.host).alive()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert process_start_ticks(gone.pid) is None
