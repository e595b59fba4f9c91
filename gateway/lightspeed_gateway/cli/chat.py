"""`lightspeed chat`: a terminal chat against a running server (--url) or an in-process engine.

One user message per line (with line editing on a terminal); the reply streams as it is generated.
Commands: /help, /reset (forget the conversation), /system TEXT (set the system prompt), /exit
(or Ctrl-D). Ctrl-C stops a reply and keeps the conversation; at the prompt, a second Ctrl-C in a
row quits. Connection problems and server errors are one line, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator

HELP = """commands:
  /help          this list
  /reset         forget the conversation (the system prompt stays)
  /system TEXT   set the system prompt (and forget the conversation)
  /exit          quit (also Ctrl-D; Ctrl-C twice at the prompt)
Ctrl-C during a reply stops it; the conversation is kept. Start a message with // to send a leading /."""


class ChatError(Exception):
    """A problem to show the user in one line (the chat goes on where it can)."""


def add_parser(sub) -> None:
    p = sub.add_parser("chat", help="chat in the terminal with a running server or an in-process engine",
                       description="Chat with a running server (--url) or with a model loaded in this process.")
    p.add_argument("--url", default=None, help="server URL, e.g. http://127.0.0.1:8000 (a trailing /v1 is fine); "
                   "default: load the model in this process instead")
    p.add_argument("--model", default=None, help="model name on the server, or model path in-process "
                   "(default: the server's first model / SmolLM2-135M-Instruct)")
    p.add_argument("--api-key", default=None, help="API key for the server (default: env LIGHTSPEED_API_KEY)")
    p.add_argument("--system", default=None, help="system prompt")
    p.add_argument("--max-tokens", type=int, default=256, help="most tokens per reply")
    p.add_argument("--temperature", type=float, default=0.7, help="sampling temperature")
    p.set_defaults(func=run, command_parser=p)


def server_root(url: str) -> str:
    """The server's root from what a user types: with or without /v1, a trailing slash, a scheme."""
    url = url.strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url
    return url[: -len("/v1")] if url.endswith("/v1") else url


class ServerChat:
    """Replies from a running server's /v1/chat/completions."""

    def __init__(self, url: str, api_key: str | None) -> None:
        import httpx

        self.url = server_root(url)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.AsyncClient(base_url=self.url, headers=headers, timeout=httpx.Timeout(None, connect=10))
        self.model = ""

    async def connect(self, model: str | None) -> str:
        resp = await self._request("GET", "/v1/models")
        models = [m.get("id") for m in resp.get("data", [])] if isinstance(resp, dict) else []
        if not models:
            raise ChatError(f"{self.url}/v1/models lists no model: is this an OpenAI-compatible server?")
        self.model = model or models[0]
        return f"chatting with {self.model} at {self.url}"

    async def _request(self, method: str, path: str) -> object:
        import httpx

        try:
            resp = await self.client.request(method, path)
        except httpx.HTTPError as e:
            raise ChatError(f"cannot reach a server at {self.url} ({type(e).__name__}: {e or 'no answer'}); "
                            "start one with `lightspeed serve`") from None
        if resp.status_code == 401:
            raise ChatError(f"{self.url} wants an API key: pass --api-key or set LIGHTSPEED_API_KEY")
        if resp.status_code != 200:
            raise ChatError(f"{self.url}{path} answered HTTP {resp.status_code}: {_error_text(resp.text)}")
        try:
            return resp.json()
        except ValueError:
            raise ChatError(f"{self.url}{path} did not answer JSON: is this an OpenAI-compatible server?") from None

    async def reply(self, messages: list[dict], args: argparse.Namespace) -> AsyncIterator[str]:
        import httpx

        body = {"model": self.model, "messages": messages, "stream": True, "max_tokens": args.max_tokens,
                "temperature": args.temperature}
        try:
            async with self.client.stream("POST", "/v1/chat/completions", json=body) as resp:
                if resp.status_code != 200:
                    detail = (await resp.aread()).decode(errors="replace")
                    raise ChatError(f"the server answered HTTP {resp.status_code}: {_error_text(detail)}")
                async for line in resp.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        raise ChatError(f"the server failed the reply: {chunk['error'].get('message')}")
                    for choice in chunk.get("choices", []):
                        if choice["delta"].get("content"):
                            yield choice["delta"]["content"]
        except httpx.HTTPError as e:
            raise ChatError(f"lost the connection to {self.url} ({type(e).__name__})") from None

    async def close(self) -> None:
        await self.client.aclose()


class LocalChat:
    """Replies from an AsyncLLM in this process, rendered with the gateway's chat template code."""

    def __init__(self) -> None:
        self.llm = None
        self.counter = 0

    async def connect(self, model: str | None) -> str:
        from lightspeed import AsyncLLM

        from lightspeed_gateway.template import ChatRenderer

        print("loading the model ...", flush=True)
        try:
            self.llm = AsyncLLM(model=model)
        except (ValueError, RuntimeError) as e:
            raise ChatError(str(e)) from None
        self.renderer = ChatRenderer(self.llm.get_tokenizer())
        return f"chatting with {self.llm.model_name} in-process"

    async def reply(self, messages: list[dict], args: argparse.Namespace) -> AsyncIterator[str]:
        from lightspeed import RequestOutputKind, SamplingParams

        from lightspeed_gateway.openai.protocol import ChatMessage

        prompt = self.renderer.render([ChatMessage(**m) for m in messages])
        params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                                output_kind=RequestOutputKind.DELTA)
        self.counter += 1
        async for out in self.llm.generate(prompt.token_ids, params, request_id=f"chat-{self.counter}"):
            for completion in out.outputs:
                if completion.text:
                    yield completion.text

    async def close(self) -> None:
        if self.llm is not None:
            self.llm.shutdown()


def _error_text(body: str) -> str:
    try:
        return json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return body.strip()[:300] or "(empty answer)"


class ChatSession:
    """The read-reply loop. Replies run on `loop`; Ctrl-C during one cancels it."""

    def __init__(self, backend, args: argparse.Namespace, loop: asyncio.AbstractEventLoop) -> None:
        self.backend, self.args, self.loop = backend, args, loop
        self.system = args.system
        self.messages = self._fresh()

    def _fresh(self) -> list[dict]:
        return [{"role": "system", "content": self.system}] if self.system else []

    def run(self) -> int:
        interrupted_at_prompt = False
        while True:
            try:
                line = input("> ")
            except EOFError:
                print()
                return 0
            except KeyboardInterrupt:
                if interrupted_at_prompt:
                    print()
                    return 0
                print("\n(Ctrl-C again, Ctrl-D or /exit quits)")
                interrupted_at_prompt = True
                continue
            interrupted_at_prompt = False
            if not self.command(line.strip()):
                return 0

    def command(self, line: str) -> bool:
        """Handle one input line; False ends the chat."""
        if not line:
            return True
        if line.startswith("/") and not line.startswith("//"):
            name, _, rest = line.partition(" ")
            if name in ("/exit", "/quit"):
                return False
            if name == "/help":
                print(HELP)
            elif name == "/reset":
                self.messages = self._fresh()
                print("(conversation forgotten)")
            elif name == "/system":
                self.system = rest.strip() or None
                self.messages = self._fresh()
                print("(system prompt set; conversation forgotten)" if self.system else "(system prompt removed)")
            else:
                print(f"unknown command {name}; /help lists them")
            return True
        self.messages.append({"role": "user", "content": line[1:] if line.startswith("//") else line})
        self.answer()
        return True

    def answer(self) -> None:
        pieces: list[str] = []

        async def stream() -> None:
            async for text in self.backend.reply(self.messages, self.args):
                pieces.append(text)
                sys.stdout.write(text)
                sys.stdout.flush()

        task = self.loop.create_task(stream())
        self.loop.add_signal_handler(signal.SIGINT, task.cancel)
        try:
            self.loop.run_until_complete(task)
            print()
        except asyncio.CancelledError:
            print(" [stopped]")
        except ChatError as e:
            print(f"\nlightspeed chat: {e}")
            self.messages.pop()  # the message got no answer: sending it again must not duplicate it
            return
        finally:
            self.loop.remove_signal_handler(signal.SIGINT)
        self.messages.append({"role": "assistant", "content": "".join(pieces)})


def run(args: argparse.Namespace) -> int:
    if args.url:
        from lightspeed_gateway.envs import load_envs

        backend = ServerChat(args.url, args.api_key or load_envs().api_key)
    else:
        # The engine core process inherits this: its start-up INFO lines would land inside the chat.
        os.environ.setdefault("LIGHTSPEED_LOG_LEVEL", "WARNING")
        backend = LocalChat()
    loop = asyncio.new_event_loop()
    try:
        try:
            banner = loop.run_until_complete(backend.connect(args.model))
        except ChatError as e:
            print(f"lightspeed chat: error: {e}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            return 130
        print(f"{banner} (/help for commands)", flush=True)
        if sys.stdin.isatty():
            try:  # line editing and history
                import readline  # noqa: F401
            except ImportError:
                pass
        return ChatSession(backend, args, loop).run()
    finally:
        loop.run_until_complete(backend.close())
        loop.close()
