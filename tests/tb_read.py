"""tb_read.py RUN_DIR — reads a run's TensorBoard event file with TensorBoard's own reader
(EventAccumulator, which also checks the TFRecord CRC32Cs) and compares it with the run's
metrics.jsonl: every train/val scalar at every step, tags of the per-worker samples; and the
resolved config in the Text tab with config.yaml.
Exit 0 when everything matches; prints what does not."""
import glob
import json
import math
import sys

from tensorboard.backend.event_processing import event_accumulator


def main(run_dir):
    files = glob.glob(run_dir + "/events.out.tfevents.*")
    assert len(files) == 1, "expected one event file, found %r" % files
    acc = event_accumulator.EventAccumulator(files[0], size_guidance={event_accumulator.SCALARS: 0,
                                                                      event_accumulator.TENSORS: 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    want = {"train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s", "train/step_ms", "train/comm_ms",
            "val/loss", "val/accuracy"}
    assert want <= tags, "missing tags: %s (have %s)" % (sorted(want - tags), sorted(tags))

    train, evals, workers = {}, {}, []
    with open(run_dir + "/metrics.jsonl") as f:
        for line in f:
            o = json.loads(line)
            if o["type"] == "train":
                train[o["step"]] = o
            elif o["type"] == "eval":
                evals[o["step"]] = o
            elif o["type"] == "workers":
                workers.append(o)

    def check(tag, expected):
        got = {e.step: e.value for e in acc.Scalars(tag)}
        assert sorted(got) == sorted(expected), "%s: steps %s, metrics.jsonl has %s" % (tag, sorted(got)[:5],
                                                                                       sorted(expected)[:5])
        for step, v in expected.items():
            assert math.isclose(got[step], v, rel_tol=1e-6, abs_tol=1e-30), "%s at step %d: %r vs %r" % (
                tag, step, got[step], v)
        return len(got)

    n = 0
    for key in ("loss", "lr", "grad_norm", "tokens_per_s", "step_ms", "comm_ms"):
        n += check("train/" + key, {s: o[key] for s, o in train.items()})
    n += check("val/loss", {s: o["val_loss"] for s, o in evals.items()})
    n += check("val/accuracy", {s: o["val_accuracy"] for s, o in evals.items()})
    for rec in workers:
        for w in rec["workers"]:
            for key in ("cpu_pct", "rss_mb"):
                tag = "worker/rank%d/%s" % (w["rank"], key)
                assert tag in tags, "missing tag %s" % tag
                got = {e.step: e.value for e in acc.Scalars(tag)}
                assert math.isclose(got[rec["step"]], w[key], rel_tol=1e-6), tag
                n += 1
    assert workers, "no workers records in metrics.jsonl"

    # the resolved config in the Text tab, as the run's config.yaml has it
    assert "config" in acc.Tags()["tensors"], "no config text (tensors: %s)" % acc.Tags()["tensors"]
    assert acc.SummaryMetadata("config").plugin_data.plugin_name == "text", "config is not a text summary"
    from tensorboard.util import tensor_util
    text = tensor_util.make_ndarray(acc.Tensors("config")[0].tensor_proto).item().decode()
    with open(run_dir + "/config.yaml") as f:
        saved = f.read()
    body = saved[saved.index("\n") + 1:]  # config.yaml starts with its own comment line
    assert text.startswith("```\n") and body in text, "the config text differs from config.yaml"
    print("tb_read: %d scalars under %d tags match metrics.jsonl (%d train steps, %d evaluations, %d worker rounds)"
          % (n, len(tags), len(train), len(evals), len(workers)))


if __name__ == "__main__":
    try:
        main(sys.argv[1])
    except AssertionError as e:
        print("tb_read: FAIL: %s" % e)
        sys.exit(1)
