"""`lightspeed chat`: a terminal chat against a running server (--url) or an in-process engine.

Reads one user message per line from stdin (`/reset` forgets the conversation, `/exit` or EOF ends)
and streams the assistant's reply to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import AsyncIterator


def add_parser(sub) -> None:
    p = sub.add_parser("chat", help="chat in the terminal with a running server or an in-process engine")
    p.add_argument("--url", default=None, help="server base URL, e.g. http://127.0.0.1:8000 (default: start an "
                   "in-process engine instead)")
    p.add_argument("--model", default=None, help="model name on the server, or model path in-process "
                   "(default: the server's first model / SmolLM2-135M-Instruct)")
    p.add_argument("--api-key", default=None, help="API key for the server (default: env LIGHTSPEED_API_KEY)")
    p.add_argument("--system", default=None, help="system prompt")
    p.add_argument("--max-tokens", type=int, default=256, help="most tokens per reply")
    p.add_argument("--temperature", type=float, default=0.7, help="sampling temperature")
    p.set_defaults(func=run)


async def _server_reply(client, args, model: str, messages: list[dict]) -> AsyncIterator[str]:
    body = {"model": model, "messages": messages, "stream": True, "max_tokens": args.max_tokens,
            "temperature": args.temperature}
    async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        if resp.status_code != 200:
            detail = (await resp.aread()).decode(errors="replace")
            raise RuntimeError(f"server answered {resp.status_code}: {detail}")
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(chunk["error"]["message"])
            for choice in chunk.get("choices", []):
                text = choice["delta"].get("content")
                if text:
                    yield text


class _LocalEngine:
    """In-process AsyncLLM with the gateway's chat template rendering."""

    def __init__(self, model: str | None) -> None:
        from lightspeed import AsyncLLM

        from lightspeed_gateway.template import ChatRenderer

        self.llm = AsyncLLM(model=model)
        self.renderer = ChatRenderer(self.llm.get_tokenizer())
        self.counter = 0

    async def reply(self, args, messages: list[dict]) -> AsyncIterator[str]:
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


async def _chat(args: argparse.Namespace) -> int:
    import httpx

    from lightspeed_gateway.envs import load_envs

    messages: list[dict] = [{"role": "system", "content": args.system}] if args.system else []
    base = list(messages)
    client, local, model = None, None, args.model
    if args.url:
        key = args.api_key or load_envs().api_key
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        client = httpx.AsyncClient(base_url=args.url.rstrip("/"), headers=headers, timeout=None)
        if model is None:
            model = (await client.get("/v1/models")).json()["data"][0]["id"]
        print(f"chatting with {model} at {args.url} (/reset, /exit)", flush=True)
    else:
        local = _LocalEngine(model)
        print(f"chatting with {local.llm.model_name} in-process (/reset, /exit)", flush=True)
    loop = asyncio.get_running_loop()
    try:
        while True:
            sys.stdout.write("> ")
            sys.stdout.flush()
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line or line.strip() == "/exit":
                break
            if line.strip() == "/reset":
                messages = list(base)
                continue
            if not line.strip():
                continue
            messages.append({"role": "user", "content": line.rstrip("\n")})
            pieces = []
            stream = _server_reply(client, args, model, messages) if client else local.reply(args, messages)
            async for text in stream:
                pieces.append(text)
                sys.stdout.write(text)
                sys.stdout.flush()
            sys.stdout.write("\n")
            messages.append({"role": "assistant", "content": "".join(pieces)})
    finally:
        if client is not None:
            await client.aclose()
        if local is not None:
            local.llm.shutdown()
    return 0


def run(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_chat(args))
    except KeyboardInterrupt:
        return 130
    except RuntimeError as e:
        print(f"lightspeed chat: {e}", file=sys.stderr)
        return 1
