import torch, torch._inductor.config as ic

print(torch.__version__)
ic.emulate_precision_casts = True


def f(x):
  return (x * 3.0).to(torch.bfloat16).float() * 1.0001


x = torch.randn(10000)
e = f(x)
c = torch.compile(f)(x)
print("compiled == eager:", torch.equal(e, c), "differing:", (e != c).float().mean().item())
