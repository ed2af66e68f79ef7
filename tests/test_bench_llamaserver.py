"""bench/llamaserver.py: the contenders it starts, the requests it sends, what it reads
back and the summary of made-up timings, without servers; how it starts them for each
repetition, with a real `specllama serve`."""

from pathlib import Path

import pytest

from bench import llamaserver as ls
from bench.lib import even
from bench.lib.processes import request
from bench.lib.server_table import fmt
from specllama.cli.bench_command.prompts import parse_prompts


def arguments(*argv: str):
    args = ls.arguments().parse_args(["--pair", "smollm2", "--threads", "2", *argv])
    args.bins = {"llama-server": Path("/bin/llama-server"),
                 "llama-lookup-create": Path("/bin/llama-lookup-create")}
    return args


def test_the_contenders_are_llama_server_alone_its_sweep_and_our_flag_sets():
    cs = ls.contenders(arguments("--n-max", "2,3", "--p-min", "0", "--ngram", "ngram-mod"),
                       Path("t.gguf"), Path("d.gguf"))
    assert [c.name for c in cs] == [
        "llama-server", "llama-server -md n-max 2 n-min 0 p-min 0",
        "llama-server -md n-max 3 n-min 0 p-min 0", "llama-server ngram-mod",
        "specllama --draft-max 0", "specllama default", "specllama --drafters model"]
    alone, md = cs[0].argv, cs[1].argv
    assert "-md" not in alone and alone[alone.index("-t") + 1] == "2"
    assert md[md.index("-md") + 1] == "d.gguf" and md[md.index("-td") + 1] == "2"
    ours = cs[-1].argv
    assert ours[ours.index("--pair") + 1] == "smollm2" and ours[-2:] == ["--drafters", "model"]
    assert {c.kind for c in cs[:4]} == {"llama-server"} and cs[-1].port_flag == "--port"


def test_llama_server_runs_with_our_batch_swa_cache_and_no_prompt_checkpoints():
    """Its defaults differ from ours (-b 2048, a window-sized SWA cache, checkpoints every
    prompt): every llama-server contender gets ours; --llama-server-defaults keeps its."""
    cs = ls.contenders(arguments("--n-max", "2", "--p-min", "0", "--n-ctx", "256"),
                       Path("t.gguf"), Path("d.gguf"))
    for c in cs[:2]:
        a = c.argv
        assert a[a.index("-b") + 1] == a[a.index("-ub") + 1] == "256"  # 512, cut to n_ctx
        assert "--swa-full" in a and a[a.index("--ctx-checkpoints") + 1] == "0"
        assert "--chat-template-file" not in a  # (no GGUF there to read)
        assert c.our_sampling and c.stop == ()
    assert "--swa-full" not in cs[-1].argv and not cs[-1].our_sampling
    alone = ls.contenders(arguments("--n-max", "", "--llama-server-defaults"),
                          Path("t.gguf"), Path("d.gguf"))[0]
    assert not {"-b", "-ub", "--swa-full", "--ctx-checkpoints"} & set(alone.argv)
    assert not alone.our_sampling


def gguf_file(path: Path, template: str | None) -> Path:
    import gguf

    w = gguf.GGUFWriter(path, "llama")
    w.add_token_list(["<unk>", "<s>", "</s>"])
    if template is not None:
        w.add_chat_template(template)
    w.add_uint32("llama.context_length", 2048)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_a_model_without_a_chat_template_chats_in_our_plain_format_on_both(tmp_path):
    """llama-server falls back to ChatML; ours to 'User: ... Assistant:' (server/prompts.py)
    with its stop string: llama-server is given both."""
    from specllama.server.prompts import PLAIN_STOP, plain_prompt

    plain = gguf_file(tmp_path / "plain.gguf", None)
    chat = gguf_file(tmp_path / "chat.gguf", "{{ messages[0].content }}")
    assert even.has_chat_template(plain) is False and even.has_chat_template(chat) is True
    assert even.has_chat_template(tmp_path / "missing.gguf") is None
    alone = ls.contenders(arguments("--n-max", ""), plain, None)[0]
    template = Path(alone.argv[alone.argv.index("--chat-template-file") + 1]).read_text()
    assert alone.stop == PLAIN_STOP == (even.PLAIN_STOP,)
    assert "--chat-template-file" not in ls.contenders(arguments("--n-max", ""), chat, None)[0].argv
    import jinja2

    turns = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi."},
             {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Why?"}]
    rendered = jinja2.Environment().from_string(template).render(
        messages=turns, add_generation_prompt=True)
    assert rendered == plain_prompt(turns) == \
        "Be brief.\n\nUser: Hi.\nAssistant: Hello.\nUser: Why?\nAssistant:"


def test_llama_server_is_asked_for_our_sampler_chain():
    """T = 0: argmax (top-k 1, nothing else: its default chain and full-vocabulary softmax
    are left out); T > 0: temperature alone, then its draw; our requests are unchanged."""
    theirs = ls.Contender("llama-server", [], "--port", "llama-server", our_sampling=True,
                          stop=("\nUser:",))
    ours = ls.Contender("specllama default", [], "--port", "specllama")
    greedy = ls.request_body(theirs, "m", "hi", 0.0, 7, 64, False, True)
    assert (greedy["samplers"], greedy["top_k"], greedy["stop"]) == (["top_k"], 1, ["\nUser:"])
    hot = ls.request_body(theirs, "m", "hi", 0.8, 7, 64, False, False)
    assert (hot["samplers"], hot["top_k"], hot["top_p"], hot["min_p"]) == \
        (["temperature"], 0, 1.0, 0.0)
    assert "stop" not in hot  # a plain completion: no chat format, no stop string
    assert ls.request_body(ours, "m", "hi", 0.0, 7, 64, False, True) == \
        ls.body("m", "hi", 0.0, 7, 64, False, True)


def test_no_sweep_leaves_llama_server_alone_and_ours():
    cs = ls.contenders(arguments("--n-max", "", "--specllama", "default"), Path("t.gguf"),
                       Path("d.gguf"))
    assert [c.name for c in cs] == ["llama-server", "specllama default"]


def test_prediction_sends_each_prompts_prediction_to_a_twin_of_each_of_ours():
    """--prediction: every specllama flag set runs again, sending the prompt's prediction
    (OpenAI's Predicted Outputs); llama-server and the plain twins never get one."""
    cs = ls.contenders(arguments("--n-max", "", "--specllama", "default", "--prediction"),
                       Path("t.gguf"), Path("d.gguf"))
    assert [c.name for c in cs] == ["llama-server", "specllama default",
                                    "specllama default +prediction"]
    bodies = [ls.request_body(c, "m", "Edit it.", 0.0, 7, 64, False, True, "the file")
              for c in cs]
    assert [b.get("prediction") for b in bodies] == \
        [None, None, {"type": "content", "content": "the file"}]
    assert cs[2].argv == cs[1].argv and cs[2].runs is not cs[1].runs
    shipped = parse_prompts(Path(ls.__file__).with_name("prompts").joinpath(
        "edit-file.jsonl").read_text())
    assert [p.id for p in shipped] == ["edit-rename", "edit-hints"]
    assert all(p.prediction and p.prediction in p.prompt and not p.chat for p in shipped)


def test_mtp_contenders_need_no_draft_file():
    """--mtp: llama-server drafts with the target's MTP layers at each n-max; without a
    draft file its -md sweep is left out."""
    cs = ls.contenders(arguments("--mtp", "1,3", "--specllama", "--drafters mtp"),
                       Path("t.gguf"), None)
    assert [c.name for c in cs] == ["llama-server", "llama-server draft-mtp n-max 1",
                                    "llama-server draft-mtp n-max 3",
                                    "specllama --drafters mtp"]
    mtp = cs[2].argv
    assert "-md" not in mtp and mtp[mtp.index("--spec-type") + 1] == "draft-mtp"
    assert mtp[mtp.index("--spec-draft-n-max") + 1] == "3"


def test_requests_are_fresh_and_sample_alike_on_both_sides():
    assert ls.fresh("Say hi.", 1, 0.8) == "(request 2-0.8)\nSay hi."
    chat = ls.body("m", "hi", 0.8, 7, 64, stream=True)
    assert chat["messages"] == [{"role": "user", "content": "hi"}]
    assert (chat["top_k"], chat["top_p"], chat["min_p"]) == (0, 1.0, 0.0)
    assert chat["stream_options"] == {"include_usage": True}
    plain = ls.body("m", "hi", 0.0, 7, 64, stream=False, chat=False)
    assert plain["prompt"] == "hi" and "messages" not in plain and "stream_options" not in plain


def test_each_servers_own_draft_counts_are_read():
    theirs = ls.Contender("llama-server -md", [], "--port", "llama-server")
    ours = ls.Contender("specllama default", [], "--port", "specllama")
    r = ls.record(theirs, {"usage": {"completion_tokens": 50, "prompt_tokens": 20},
                           "timings": {"draft_n": 30, "draft_n_accepted": 12}}, 2.0)
    assert (r["tokens"], r["tokens_per_s"], r["drafted"], r["accepted"]) == (50, 25.0, 30, 12)
    r = ls.record(ours, {"usage": {"completion_tokens": 40},
                         "speculative": {"drafted": 20, "accepted": 15, "policy": "auto: x"}},
                  0.5)
    assert (r["tokens_per_s"], r["drafted"], r["accepted"], r["policy"]) == \
        (80.0, 20, 15, "auto: x")


def contender(name: str, kind: str, per_rep: list[list[float]], drafted: int = 0,
              accepted: int = 0) -> ls.Contender:
    c = ls.Contender(name, [], "--port", kind)
    c.runs[0.0] = [[{"tokens_per_s": x, "tokens": 10, "drafted": drafted,
                     "accepted": accepted} for x in rep] for rep in per_rep]
    return c


def test_the_summary_pairs_ratios_within_a_repetition_and_stars_llama_servers_best():
    cs = [contender("llama-server", "llama-server", [[20.0, 80.0], [10.0, 40.0]]),
          contender("llama-server -md a", "llama-server", [[40.0, 40.0], [30.0, 30.0]], 4, 2),
          contender("llama-server -md b", "llama-server", [[30.0, 30.0], [20.0, 20.0]], 4, 1),
          contender("specllama default", "specllama", [[60.0, 60.0], [30.0, 30.0]], 8, 6)]
    rows = {r["contender"]: r for r in ls.summarize(cs, 0.0)}
    # geometric means per repetition: alone 40 and 20, "a" 40 and 30, ours 60 and 30
    assert rows["llama-server"]["tokens_per_s"] == \
        pytest.approx({"min": 20.0, "median": 30.0, "max": 40.0})
    assert rows["specllama default"]["vs_llama_server_alone"] == \
        pytest.approx({"min": 1.5, "median": 1.5, "max": 1.5})
    assert rows["llama-server -md a"]["best_llama_server_speculative"]
    assert not rows["llama-server -md b"]["best_llama_server_speculative"]
    assert rows["specllama default"]["vs_best_llama_server_speculative"] == \
        pytest.approx({"min": 1.0, "median": 1.25, "max": 1.5})
    assert rows["specllama default"]["acceptance"] == pytest.approx(0.75)
    assert rows["specllama default"]["drafted_per_request"] == 8
    assert rows["llama-server"]["acceptance"] is None
    assert fmt(rows["specllama default"]["vs_best_llama_server_speculative"]) == \
        "1.25 [1.00-1.50]"


def test_pooled_ratios_weigh_each_token_once():
    cs = [contender("llama-server", "llama-server", [[10.0, 40.0]]),
          contender("specllama --draft-max 0", "specllama", [[20.0, 20.0]]),
          contender("specllama default", "specllama", [[40.0, 10.0]])]
    rows = {r["contender"]: r for r in ls.summarize(cs, 0.0)}
    # 10 tokens each: alone 20 tokens in 1.25 s (16/s), own target 20 in 1 s, ours 1.25 s
    assert rows["specllama default"]["pooled_vs_llama_server_alone"]["median"] == \
        pytest.approx(1.0)
    assert rows["specllama default"]["pooled_vs_own_target"]["median"] == pytest.approx(0.8)
    assert rows["specllama --draft-max 0"]["pooled_vs_llama_server_alone"]["median"] == \
        pytest.approx(1.25)
    assert "pooled_vs_own_target" not in ls.summarize(cs[::2], 0.0)[1]


def test_the_summary_without_a_speculative_llama_server():
    cs = [contender("llama-server", "llama-server", [[20.0]]),
          contender("specllama default", "specllama", [[30.0]])]
    rows = ls.summarize(cs, 0.0)
    assert "vs_best_llama_server_speculative" not in rows[1]
    assert rows[1]["vs_llama_server_alone"]["median"] == pytest.approx(1.5)


def test_every_repetition_meets_servers_that_have_seen_none_of_the_last(
        tiny_target, tiny_draft, monkeypatch):
    """A server that drafts from what it generated (ours; llama-server's n-gram kinds)
    would copy the last repetition's answers to the same prompts: each repetition starts
    every server afresh, warmed on a prompt of no repetition's. A real `specllama serve`."""
    started: list = []

    class Watched(ls.ApiServer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            started.append(self)

        def stop(self):
            _, health, _ = request(self.port, "/health", None, 10)
            self.served = health["requests"]["completed"]
            super().stop()

    monkeypatch.setattr(ls, "ApiServer", Watched)
    args = ls.arguments().parse_args([
        "--target", str(tiny_target), "--draft", str(tiny_draft), "--threads", "1",
        "--n-ctx", "256", "--reps", "2", "--max-tokens", "8", "--temperatures", "0",
        "--specllama", "--drafters lookup"])
    args.temps = [0.0]
    prompts = parse_prompts('{"id": "p", "prompt": "the cat sat on the", "chat": false}')
    (ours,) = ls.specllama_contenders(args)
    ls.run_all([ours], args, prompts)
    assert len(started) == 2  # one server a repetition
    assert [s.served for s in started] == [2, 2]  # its warm-up and its own request
    assert [len(rep) for rep in ours.runs[0.0]] == [1, 1]
    assert ls.WARM_UP not in prompts[0].prompt
