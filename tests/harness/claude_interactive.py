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
# The longest wait for the interface to draw its input prompt, and the prompt's glyph.
START_SECONDS = 60.0
PROMPT = "\u276f".encode()


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

    screen = bytearray()

    def read(longest, done):
        """Read the screen until `done(seconds since it last changed)`, or `longest` passed."""
        end = time.time() + longest
        last = time.time()
        while time.time() < end and not done(time.time() - last):
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
                screen.extend(data)
                last = time.time()

    def wait_still(longest):
        """Read the screen until it has been still for STILL_SECONDS, or `longest` passed."""
        read(longest, lambda still: still >= STILL_SECONDS)

    def type_line(line):
        for ch in line:
            os.write(fd, ch.encode())
            time.sleep(0.02)
        wait_still(1.0)
        os.write(fd, b"\r")

    # Typing starts once the input prompt is drawn and the screen has settled: on a slow
    # machine the interface can be silent for seconds while it starts.
    read(START_SECONDS, lambda _: PROMPT in screen)
    wait_still(STILL_SECONDS + 1.0)
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
