"""Ad-hoc: single-stream decode tok/s of the default model on this CPU (1 thread), one tree."""
import sys, time, statistics
import lightspeed
from lightspeed import LLM, SamplingParams
llm = LLM(None, max_model_len=2048, kv_cache_memory="128MiB")
p = SamplingParams(max_tokens=128, temperature=0.0, ignore_eos=True)
prompt = [[10 + i for i in range(64)]]
llm.generate(prompt, p)
rates = []
for _ in range(int(sys.argv[1])):
    one = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    t0 = time.perf_counter(); llm.generate(prompt, one); t1 = time.perf_counter()
    llm.generate(prompt, p); t2 = time.perf_counter()
    rates.append(127 / ((t2 - t1) - (t1 - t0)))
print(lightspeed.__file__, "tok/s", [round(r, 1) for r in rates], "median", round(statistics.median(rates), 1), flush=True)
