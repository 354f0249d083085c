import torch, torch._inductor.config as ic

ic.emulate_precision_casts = True


def pair(x):
  return (x * 3.0).to(torch.bfloat16).float() * 1.0001


def show(graph):
  print(
    torch.__version__,
    [
      (n.target.__name__ if hasattr(n.target, "__name__") else str(n.target), n.args[1:])
      for n in graph.nodes
      if n.op == "call_function"
    ],
  )


x = torch.randn(100)
with ic.patch(joint_custom_post_pass=show):
  torch.compile(pair)(x)
