import json, sys
import torch

sys.path.insert(0, "/work/main/torch_crosscheck")
import gpt_twin as T, common, paper_fa2
import torch._inductor.config as inductor_config

torch.set_num_threads(1)
if sys.argv[1] == "old":
  paper_fa2.rb = lambda x: x.to(torch.bfloat16).float()
out = {}
for drop in (False, True):
  torch._dynamo.reset()
  name = sys.argv[1] + ("-drop" if drop else "")
  cfg = T.TwinConfig(
    init="/tmp/old/init.npz",
    attention="paper",
    block_q=64,
    block_k=64,
    n_layer=2,
    n_head=2,
    n_embd=64,
    block_size=128,
    steps=2,
    batch_size=2,
    seed=3,
    warmup_steps=1,
    eval_interval=0,
    eval_batches=1,
    diag_interval=2,
    diag_rows=8,
    device="cpu",
    print_interval=0,
    compile="on",
    out_dir=f"/tmp/old/{name}",
  )
  with inductor_config.patch(
    joint_custom_post_pass=(lambda g: common.drop_convert_pairs(g, keep_rounded=True))
    if drop
    else None
  ):
    T.train(cfg)
  out[name] = [json.loads(l) for l in open(f"/tmp/old/{name}/metrics.jsonl")]
print({k: [(r["loss"], r["grad_norm"]) for r in v] for k, v in out.items()})
