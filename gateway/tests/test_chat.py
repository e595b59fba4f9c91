"""`lightspeed chat` driven through a pseudo-terminal (stdlib `pty`), as a user at a keyboard:
a /v1 URL, commands that never reach the model, Ctrl-C that stops a reply and keeps the
conversation, a server that is down, an in-process engine whose logs stay out of the chat."""

import os
import pty
import re
import select
import signal
import socket
import subprocess
import sys
import time

from gateway_testing import requires_real_engine


class PtyChat:
    """`lightspeed chat ARGS` on a pty: `send` types, `expect` waits for output matching a pattern."""

    def __init__(self, *args: str) -> None:
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: a terminal session of its own, like a shell would start it
            os.execv(sys.executable, [sys.executable, "-m", "lightspeed_gateway", "chat", *args])
        self.output = ""

    def _read(self, timeout_s: float) -> bool:
        ready, _, _ = select.select([self.fd], [], [], timeout_s)
        if not ready:
            return False
        try:
            data = os.read(self.fd, 4096)
        except OSError:  # the child closed the terminal
            return False
        self.output += data.decode(errors="replace").replace("\r\n", "\n")
        return bool(data)

    def expect(self, pattern: str, timeout_s: float = 120.0, start: int = 0) -> re.Match:
        deadline = time.monotonic() + timeout_s
        while not (match := re.compile(pattern).search(self.output, start)):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no {pattern!r} in:\n{self.output[-2000:]}")
            self._read(min(1.0, remaining))
        return match

    def send(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def await_prompt_read(self, timeout_s: float = 30.0) -> None:
        """Wait until the chat is blocked reading the terminal, so a Ctrl-C sent next is seen.

        CPython's readline loses a SIGINT that lands after the prompt is drawn but before it
        blocks in select() (the flag is set, nothing wakes the select). A person cannot hit that
        window of microseconds; a test that types the moment "> " appears can, on a loaded
        2-core machine. /proc/PID/syscall shows the blocking call: pselect6/select on fd 0."""
        path = f"/proc/{self.pid}/syscall"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                fields = open(path).read().split()
            except OSError:  # no /proc/PID/syscall here: a pause long enough in practice
                time.sleep(0.5)
                return
            if fields[:1] in (["270"], ["23"], ["72"]) and fields[1:2] == ["0x1"]:  # x86_64 / aarch64
                return
            time.sleep(0.01)
        raise AssertionError(f"chat never blocked reading the terminal:\n{self.output[-2000:]}")

    def wait(self, timeout_s: float = 30.0) -> int:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._read(0.2)
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
        os.kill(self.pid, signal.SIGKILL)
        raise AssertionError(f"chat did not exit:\n{self.output[-2000:]}")


def _prompt_tokens(log: str) -> list[int]:
    """Prompt sizes of the chat requests the server logged (--enable-log-requests), in order."""
    return [int(n) for n in re.findall(r"request chatcmpl-\w+: (\d+) prompt tokens, max_tokens 200", log)]


@requires_real_engine
def test_commands_ctrl_c_and_the_conversation_kept(compat_server):
    logged_before = len(_prompt_tokens(compat_server.output()))
    chat = PtyChat("--url", compat_server.url + "/v1/", "--max-tokens", "200", "--temperature", "0")
    chat.expect(r"chatting with SmolLM2-135M-Instruct at http://127\.0\.0\.1:\d+ \(/help for commands\)")
    chat.expect(r"> ")
    chat.send("/help\r")
    chat.expect(r"/reset +forget the conversation")
    chat.send("/bogus\r")
    chat.expect(r"unknown command /bogus; /help lists them")
    mark = len(chat.output)
    chat.send("Tell me a long story about a dragon.\r")
    chat.expect(r"dragon\.\n\S.{8}", start=mark)  # the echo, then the first words of the reply
    chat.send("\x03")  # Ctrl-C while the reply streams
    chat.expect(r"\[stopped\]\n> ", start=mark)
    mark = len(chat.output)
    chat.send("What happened next?\r")
    chat.expect(r"next\?\n\S", start=mark)
    chat.send("\x03")
    chat.expect(r"\[stopped\]\n> ", start=mark)
    chat.await_prompt_read()
    chat.send("\x03")  # at the prompt: a hint, then a second Ctrl-C quits
    chat.expect(r"Ctrl-C again, Ctrl-D or /exit quits\)\n> ")
    chat.await_prompt_read()
    chat.send("\x03")
    assert chat.wait() == 0
    assert "Traceback" not in chat.output
    sizes = _prompt_tokens(compat_server.output())[logged_before:]
    assert len(sizes) == 2, compat_server.output()[-3000:]  # /help and /bogus never reached the model
    # The second prompt carries the first question and the part of the reply shown before Ctrl-C.
    assert sizes[1] > sizes[0] + 5


def test_a_server_that_is_down_is_one_line():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once the socket closes
    result = subprocess.run([sys.executable, "-m", "lightspeed_gateway", "chat", "--url", f"127.0.0.1:{port}"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and "cannot reach a server at http://127.0.0.1" in result.stderr
    assert "lightspeed serve" in result.stderr


def test_a_url_that_is_not_a_server_root_is_one_line(compat_server):
    result = subprocess.run([sys.executable, "-m", "lightspeed_gateway", "chat", "--url",
                             compat_server.url + "/v2"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and result.stderr.count("\n") == 1
    assert "answered HTTP 404" in result.stderr


@requires_real_engine
def test_in_process_chat_keeps_engine_logs_out():
    chat = PtyChat("--max-tokens", "3", "--temperature", "0")
    chat.expect(r"chatting with \S+ in-process \(/help for commands\)\n> ", timeout_s=240)
    chat.send("Hi\r")
    chat.expect(r"Hi\n.+\n> ", timeout_s=120)
    chat.send("/exit\r")
    assert chat.wait() == 0
    assert " INFO " not in chat.output and "engine-core" not in chat.output and "Traceback" not in chat.output
