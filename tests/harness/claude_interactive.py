"""Drive Claude Code's interactive terminal interface as a person would: start `claude` in a
pseudo-terminal, type each line given, press Enter, and wait until the screen is still (the
answer is drawn) before the next; then leave with Ctrl-C twice. The terminal's output goes to
`HOME/tty.log`.

Usage: claude_interactive.py CLAUDE WORK HOME LINE...

The environment (base URL, key) is the caller's. HOME gets the settings a first start would
ask for: onboarding done, WORK trusted, the key approved.
"""

import json
import os
import pty
import select
import sys
import time

# Seconds of a still screen that end a wait, and the longest wait for one line.
STILL_SECONDS = 3.0
LINE_SECONDS = 45.0


def main():
    claude, work, home, lines = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    key = os.environ["ANTHROPIC_API_KEY"]
    settings = {
        "hasCompletedOnboarding": True,
        "theme": "dark",
        "numStartups": 3,
        "customApiKeyResponses": {"approved": [key[-20:]], "rejected": []},
        "projects": {
            work: {
                "hasTrustDialogAccepted": True,
                "hasCompletedProjectOnboarding": True,
                "allowedTools": [],
            }
        },
    }
    with open(os.path.join(home, ".claude.json"), "w") as f:
        json.dump(settings, f)
    env = dict(os.environ, HOME=home, TERM="xterm-256color", COLUMNS="120", LINES="40")
    pid, fd = pty.fork()
    if pid == 0:
        os.chdir(work)
        os.execve(claude, [claude, "--allowedTools", "Bash(echo:*)"], env)
    log = open(os.path.join(home, "tty.log"), "wb")

    def wait_still(longest):
        """Read the screen until it has been still for STILL_SECONDS, or `longest` passed."""
        end = time.time() + longest
        last = time.time()
        while time.time() < end and time.time() - last < STILL_SECONDS:
            ready, _, _ = select.select([fd], [], [], 0.2)
            if ready:
                try:
                    data = os.read(fd, 65536)
                except OSError:
                    return
                if not data:
                    return
                log.write(data)
                log.flush()
                last = time.time()

    def type_line(line):
        for ch in line:
            os.write(fd, ch.encode())
            time.sleep(0.02)
        wait_still(1.0)
        os.write(fd, b"\r")

    wait_still(20.0)
    for line in lines:
        type_line(line)
        # The screen moves on at once (the line, a spinner); it is still once answered.
        time.sleep(1.0)
        wait_still(LINE_SECONDS)
    for _ in range(2):
        os.write(fd, b"\x03")
        wait_still(1.0)
    try:
        os.kill(pid, 9)
    except ProcessLookupError:
        pass
    os.waitpid(pid, 0)


if __name__ == "__main__":
    main()
