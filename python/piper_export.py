#!/usr/bin/env python3
"""Export a PyTorch model as a Piper model.pt: TorchScript code and weights plus the region manifest.

A region is a submodule whose forward runs on its own (activation in, activation out). The model's
*sequence* is the list of top-level regions a pipeline cuts; chained, they must reproduce the
model's forward. Further regions below them (``layers.0.attn``) may be named for strategies to
select. The manifest (docs/manifest.md) is measured by running the example input through the
sequence, and saved inside the archive as ``piper/manifest.json``.

As a module::

    import piper_export
    seq = piper_export.expand(model, "embed", "layers", "head")   # layers -> layers.0 ... layers.N-1
    piper_export.export(model, torch.zeros(1, 64, dtype=torch.long), "model.pt", sequence=seq,
                        regions=[f"layers.{i}.attn" for i in range(n)], kinds={"layers": "block"})

Your own module names stay: ``names`` maps module paths to the region names the strategy library
selects (``embed``, ``layers.i``, ``head``), e.g. ``names={"transformer.h": "layers"}`` makes
``transformer.h.3`` the region ``layers.3`` (its manifest entry keeps ``module: transformer.h.3``).

As a command (the factory returns the model; the example input is zeros of the given shape)::

    python3 piper_export.py my_model:build --example-shape 1,64 --sequence embed layers head -o model.pt
"""
import argparse
import copy
import importlib
import json
import math
import sys

import torch

MANIFEST_FILE = "piper/manifest.json"
_DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16",
           torch.int64: "int64", torch.int32: "int32", torch.uint8: "uint8"}


class ExportError(Exception):
    """A problem with the model or the region mapping, said in the user's terms."""


def expand(model, *names):
    """Top-level names with ModuleList/Sequential children expanded: ``layers`` -> ``layers.0``, ..."""
    out = []
    for name in names:
        sub = model.get_submodule(name)
        if isinstance(sub, (torch.nn.ModuleList, torch.nn.Sequential)):
            out.extend(f"{name}.{i}" for i in range(len(sub)))
        else:
            out.append(name)
    return out


def region_name(path, names):
    """The region name of module ``path``: its longest prefix in ``names`` replaced."""
    best = None
    for prefix in names or {}:
        if (path == prefix or path.startswith(prefix + ".")) and (best is None or len(prefix) > len(best)):
            best = prefix
    return path if best is None else names[best] + path[len(best):]


def describe(v):
    """A value as an error shows it: Tensor[1, 32, 256] (float32), tuple (Tensor[1, 1, 256], None)."""
    if isinstance(v, torch.Tensor):
        return f"Tensor[{', '.join(map(str, v.shape))}] ({_DTYPES.get(v.dtype, str(v.dtype))})"
    if isinstance(v, (tuple, list)):
        return f"{type(v).__name__} (" + ", ".join(describe(e) for e in v) + ")"
    return "None" if v is None else type(v).__name__


def _spec(t):
    if not isinstance(t, torch.Tensor):
        raise ExportError(f"regions must take and return one tensor, got {type(t).__name__}")
    return {"shape": list(t.shape[1:]), "dtype": _DTYPES.get(t.dtype, str(t.dtype))}


def _tokens(t):
    """Tokens per sample: every dimension but the batch and (for float activations) the features."""
    dims = list(t.shape[1:])
    if t.is_floating_point() and dims:
        dims = dims[:-1]
    return math.prod(dims) if dims else 1


def _refuse_aliases(model, all_regions, holders):
    """A region's tensor also kept under a module path outside every region (a wrapper around
    ``transformer.wte`` while ``self.transformer`` keeps it too): TorchScript saves the whole module
    tree, so the archive would hold that path beside the regions, and piper-model verify refuses it.
    Said here, with the fix, rather than there."""
    inside = lambda path: any(path.startswith(r + ".") for r in all_regions)  # noqa: E731
    for mpath, mod in model.named_modules(remove_duplicate=False):
        for pname, p in mod._parameters.items():
            path = f"{mpath}.{pname}" if mpath else pname
            if p is None or inside(path) or id(p) not in holders:
                continue
            region, name = holders[id(p)][0]
            owner = mpath or "the root module"
            raise ExportError(f"parameter '{path}' is the tensor region '{region}' holds as '{name}': one tensor under "
                              f"two module paths, and '{owner}' is outside every region, so the archive would keep it "
                              f"beside them. Reach it through the region alone (e.g. `del model.{mpath}` once "
                              f"'{region}' wraps it, or don't keep the module under both names), or make '{owner}' a "
                              "region of the sequence")


def build_manifest(model, example, sequence, regions=(), kinds=None, name=None, names=None):
    kinds = kinds or {}
    all_regions = list(sequence) + [r for r in regions if r not in sequence]
    modules = {}
    for r in all_regions:
        try:
            modules[r] = model.get_submodule(r)
        except AttributeError as e:
            raise ExportError(f"region '{r}' is not a submodule of the model ({e})") from None
    for r in regions:
        if not any(r.startswith(s + ".") for s in sequence):
            raise ExportError(f"region '{r}' is not inside any sequence region")

    shapes = {}
    hooks = []
    for r, m in modules.items():
        if r in sequence:
            continue
        def hook(mod, inputs, output, r=r):
            shapes.setdefault(r, (inputs[0] if inputs else None, output))  # None: called by keyword only
        hooks.append(m.register_forward_hook(hook))
    was_training = model.training
    model.eval()  # dropout off while the chain is compared with the whole
    try:
        with torch.no_grad():
            x = example
            for r in sequence:
                try:
                    y = modules[r](x)
                except Exception as e:  # in the user's terms: which region, fed what
                    raise ExportError(f"region '{region_name(r, names)}' (module {r}) fails on its input "
                                      f"{describe(x)}: {str(e).splitlines()[0]}") from None
                if not isinstance(y, torch.Tensor):
                    raise ExportError(f"region '{region_name(r, names)}' (module {r}) returned {describe(y)}; a region "
                                      "returns one tensor")
                shapes[r] = (x, y)
                x = y
            whole = model(example)
    finally:
        for h in hooks:
            h.remove()
        model.train(was_training)  # the caller's mode, as it was
    for r, (i, _) in shapes.items():
        if i is None:
            raise ExportError(f"region '{region_name(r, names)}' (module {r}) is called with keyword arguments only "
                              "(e.g. hidden_states=...): a region takes its activation as its first positional argument; "
                              "name a module that does, or leave it out of the regions")
    if not isinstance(whole, torch.Tensor):
        raise ExportError(f"the model's forward returned {describe(whole)}; expected one [batch, seq, vocab] tensor "
                          "(the logits of every position)")
    if whole.shape != x.shape or not torch.allclose(whole, x, atol=1e-5, rtol=1e-5):
        raise ExportError("the sequence regions chained do not reproduce the model's forward "
                          f"({describe(x)} chained, {describe(whole)} whole); sequence was {sequence}")

    # Each parameter belongs to the deepest region that contains it, by each path it is reached by:
    # a tensor reached from two regions (tied weights, e.g. an embedding and the output head) is
    # listed by both and declared in "ties", so that Piper keeps the copies of different stages equal.
    def deepest(path):
        return max((r for r in all_regions if path.startswith(r + ".")), key=len)
    holders = {}  # id(tensor) -> [(region, name in region)] in region order
    for r in all_regions:
        for pname, p in modules[r].named_parameters():
            home = deepest(f"{r}.{pname}")
            entry = (home, f"{r}.{pname}"[len(home) + 1:])
            if entry not in holders.setdefault(id(p), []):
                holders[id(p)].append(entry)
    for pname, p in model.named_parameters():
        if id(p) not in holders:
            raise ExportError(f"parameter '{pname}' is not inside any region: add its module to the sequence")
    _refuse_aliases(model, all_regions, holders)
    order = {r: i for i, r in enumerate(all_regions)}
    ties = []
    for h in holders.values():
        h.sort(key=lambda e: order[e[0]])
        if len({r for r, _ in h}) != len(h):
            raise ExportError(f"region '{region_name(h[0][0], names)}' reaches one tensor as "
                              f"{' and '.join(n for _, n in h)}; tie tensors across regions only")
        if len(h) > 1:
            ties.append([{"region": region_name(r, names), "param": n} for r, n in h])
    out_regions = []
    for r in all_regions:
        params = []
        for pname, p in modules[r].named_parameters():
            if (r, pname) not in holders[id(p)]:
                continue
            params.append({"name": pname, "shape": list(p.shape), "dtype": _DTYPES.get(p.dtype, str(p.dtype)),
                           "bytes": p.numel() * p.element_size()})
        rn = region_name(r, names)
        entry = {"name": rn, "kind": kinds.get(rn, kinds.get(rn.split(".")[0], type(modules[r]).__name__.lower())),
                 "module": r, "params": params}
        if r in shapes:
            i, o = shapes[r]
            entry["input"], entry["output"] = _spec(i), _spec(o)
            # Estimate: two FLOPs per weight per token (matmul-dominated regions), for this region alone.
            entry["flops"] = 2 * sum(p["bytes"] // 4 for p in params if len(p["shape"]) > 1) * _tokens(i)
        out_regions.append(entry)
    return {
        "format": "piper-manifest", "version": 1,
        "model": {"name": name or type(model).__name__, "arch": type(model).__name__, "config": {}},
        "input": _spec(example),
        "loss": "cross_entropy(last region output [batch, seq, vocab], next tokens [batch, seq])",
        "sequence": [region_name(r, names) for r in sequence], "regions": out_regions,
        **({"ties": ties} if ties else {}),
    }


def export(model, example, path, sequence, regions=(), kinds=None, name=None, names=None, capture="script"):
    """Capture the model as TorchScript, measure the manifest, save both to ``path``. Returns the
    manifest. ``sequence`` and ``regions`` are module paths; ``names`` renames them (see region_name).
    ``capture``: "script" (torch.jit.script: control flow and training/eval kept) or "trace"
    (torch.jit.trace on the example: for code TorchScript cannot compile, such as nanoGPT's flash
    attention call; see _trace for what tracing freezes and how it is checked)."""
    manifest = build_manifest(model, example, sequence, regions, kinds, name, names)
    region_names = [r["name"] for r in manifest["regions"]]
    if len(set(region_names)) != len(region_names):
        raise ExportError(f"names maps two modules to one region name: {sorted(region_names)}")
    if capture not in ("script", "trace"):
        raise ExportError(f"capture is 'script' or 'trace', not {capture!r}")
    was_training = model.training
    model.train()  # saved in training mode: piper-run trains it (dropout as the model says)
    try:
        captured = _trace(model, example, sequence) if capture == "trace" else torch.jit.script(model)
    except ExportError:
        raise
    except Exception as e:  # TorchScript's errors are long; keep the first lines
        raise ExportError("the model cannot be scripted with torch.jit.script:\n" + "\n".join(str(e).splitlines()[:12]) +
                          "\n(code TorchScript cannot compile can be traced instead: capture=\"trace\", docs/models.md)") from None
    finally:
        model.train(was_training)
    torch.jit.save(captured, path, _extra_files={MANIFEST_FILE: json.dumps(manifest, indent=1)})
    return manifest


def _with_module(root, path, module):
    """A shallow copy of ``root`` whose submodule at ``path`` is ``module``: the modules on the way are
    copied (their other children and parameters shared), the user's model is left as it is."""
    head, _, rest = path.partition(".")
    top = copy.copy(root)
    top._modules = dict(root._modules)
    top._modules[head] = module if not rest else _with_module(root._modules[head], rest, module)
    return top


def _trace(model, example, sequence):
    """Each sequence region traced on its own input, the model's forward scripted around them (so it
    must be scriptable: export_chain's is). Regions are traced one by one because a whole-model trace
    passes a tied parameter into the second region that uses it as an argument, and a region must run
    on its own. Tracing records the ops one run takes: Python control flow, `self.training` tests and
    dropout probabilities are frozen as they were (training mode), tensor sizes stay symbolic. Piper
    runs the same modules for training and (in eval mode) validation at other batch sizes, so the
    result is checked against the model itself: in eval mode (where a frozen training-mode branch,
    dropout > 0, would differ) and at twice the example's batch."""
    captured = model
    with torch.no_grad():
        model.eval()
        x = example
        inputs = {}
        for r in sequence:
            inputs[r] = x
            x = model.get_submodule(r)(x)
        model.train()
        for r in sequence:
            traced = torch.jit.trace(model.get_submodule(r), inputs[r], check_trace=False)
            captured = _with_module(captured, r, traced)
    try:
        scripted = torch.jit.script(captured)
    except Exception as e:
        raise ExportError("capture=\"trace\" traces each region and scripts the model's forward around them, and "
                          "that forward does not script (export_chain builds one that does):\n" +
                          "\n".join(str(e).splitlines()[:8])) from None
    with torch.no_grad():
        model.eval()
        scripted.eval()
        bigger = torch.cat([example, example])
        for x, what in ((example, "in eval mode"), (bigger, f"at batch {bigger.shape[0]} (the example's is {example.shape[0]})")):
            try:
                want, got = model(x), scripted(x)
            except Exception as e:
                raise ExportError(f"the traced model fails {what}: {str(e).splitlines()[0]}") from None
            if want.shape != got.shape or not torch.allclose(want, got, atol=1e-5, rtol=1e-5):
                raise ExportError(f"the traced model differs from the model {what}: tracing froze a branch or a size "
                                  "(dropout > 0 or a `self.training` test; a constant batch in view/reshape); export with "
                                  "dropout 0 and sizes from x.size(), or make the model scriptable")
        model.train()
        scripted.train()
    return scripted


class TokenEmbedding(torch.nn.Module):
    """The embedding region export_chain builds: token embedding, plus position embedding where
    there is one, then the listed modules (dropout) in order."""

    def __init__(self, tokens, positions=None, after=()):
        super().__init__()
        self.tokens = tokens
        self.positions = positions if positions is not None else torch.nn.Identity()
        self.has_positions = positions is not None
        self.after = Steps(list(after))

    def forward(self, idx):
        x = self.tokens(idx)
        if self.has_positions:
            x = x + self.positions(torch.arange(idx.size(1), device=idx.device))
        return self.after(x)


class Steps(torch.nn.Module):
    """Modules applied in order: the head export_chain builds (one region, where a Sequential would
    be expanded into several)."""

    def __init__(self, steps):
        super().__init__()
        self.steps = torch.nn.ModuleList(steps)

    def forward(self, x):
        for step in self.steps:
            x = step(x)
        return x


class RotaryBlock(torch.nn.Module):
    """A block that takes rotary position embeddings from a module the model shares among its blocks
    (Hugging Face's Llama, Mistral, Qwen: ``layer(x, position_embeddings=rotary(x, positions))``),
    as a region: activation in, activation out. The shared module holds no parameters, only its
    frequencies, so each block carrying it adds nothing to train or tie."""

    def __init__(self, block, rotary):
        super().__init__()
        self.block, self.rotary = block, rotary

    def forward(self, x):
        positions = torch.arange(x.size(1), device=x.device).unsqueeze(0)
        return self.block(x, position_embeddings=self.rotary(x, positions))


class Chain(torch.nn.Module):
    """The root export_chain builds: embed, the blocks, the head, in order; every position's logits."""

    def __init__(self, embed, layers, head):
        super().__init__()
        self.embed, self.layers, self.head = embed, layers, head

    def forward(self, idx):
        x = self.embed(idx)
        for block in self.layers:
            x = block(x)
        return self.head(x)


def export_chain(model, example, path, embed, blocks, head, positions=None, embed_after=(), regions_in_block=(),
                 name=None, capture="script", rotary=None):
    """Exports a model whose own forward does not chain regions — nanoGPT's embeds inline and returns
    only the last position's logits when it has no targets — without the user writing modules:
    ``embed`` (the token embedding's path), ``positions`` (the position embedding's, or None) and
    ``embed_after`` (paths applied after them, e.g. dropout) become the region ``embed``; ``blocks``
    (a ModuleList's path) the regions ``layers.i``; ``head`` (paths applied in order, e.g. the final
    norm and the output projection) the region ``head``. The model's own modules are used, not copied:
    a head that shares the token embedding's matrix stays tied. ``rotary``: the path of a module the
    blocks share for rotary position embeddings (each block then becomes a RotaryBlock). ``capture``:
    see export. For nanoGPT::

        export_chain(gpt, torch.zeros(1, 64, dtype=torch.long), "model.pt", embed="transformer.wte",
                     positions="transformer.wpe", embed_after=["transformer.drop"], blocks="transformer.h",
                     head=["transformer.ln_f", "lm_head"], regions_in_block=["attn", "mlp"])
    """
    get = model.get_submodule
    try:
        chain = Chain(TokenEmbedding(get(embed), get(positions) if positions else None, [get(p) for p in embed_after]),
                      get(blocks), Steps([get(p) for p in head]))
    except AttributeError as e:
        raise ExportError(f"export_chain: {e}") from None
    if not isinstance(chain.layers, torch.nn.ModuleList):
        raise ExportError(f"export_chain: blocks '{blocks}' is a {type(chain.layers).__name__}, expected a ModuleList")
    if rotary:
        try:
            shared = get(rotary)
        except AttributeError as e:
            raise ExportError(f"export_chain: {e}") from None
        chain.layers = torch.nn.ModuleList([RotaryBlock(b, shared) for b in chain.layers])
        regions_in_block = [f"block.{r}" for r in regions_in_block]
    chain.train(model.training)
    n = len(chain.layers)
    left = {id(p) for p in model.parameters()} - {id(p) for p in chain.parameters()}
    if left:
        names = [k for k, p in model.named_parameters() if id(p) in left]
        raise ExportError(f"export_chain: the chain leaves out parameters {names}: name their modules in embed, "
                          "positions, embed_after, blocks or head")
    return export(chain, example, path, expand(chain, "embed", "layers", "head"),
                  regions=[f"layers.{i}.{r}" for i in range(n) for r in regions_in_block], kinds={"layers": "block"},
                  name=name or type(model).__name__, capture=capture)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("factory", help="module:function returning the model (module importable from here)")
    ap.add_argument("--example-shape", required=True, help="comma-separated shape of the example input, e.g. 1,64")
    ap.add_argument("--example-dtype", default="int64", choices=["int64", "float32"])
    ap.add_argument("--sequence", nargs="+", required=True, help="top-level regions (lists are expanded)")
    ap.add_argument("--regions", nargs="*", default=[], help="further regions below the sequence")
    ap.add_argument("--name", help="model name in the manifest")
    ap.add_argument("-o", "--output", required=True)
    args = ap.parse_args(argv)
    mod, _, fn = args.factory.partition(":")
    sys.path.insert(0, ".")
    model = getattr(importlib.import_module(mod), fn or "build")()
    shape = [int(s) for s in args.example_shape.split(",")]
    example = torch.zeros(shape, dtype=torch.long if args.example_dtype == "int64" else torch.float32)
    try:
        m = export(model, example, args.output, expand(model, *args.sequence), args.regions, name=args.name)
    except ExportError as e:
        print(f"piper_export: error: {e}", file=sys.stderr)
        return 1
    print(f"{args.output}: {len(m['regions'])} regions, sequence of {len(m['sequence'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
