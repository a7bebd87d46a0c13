"""Proton's case studies (CGO'26 Figs. 8, 9, 10, 12), pure compute plus Proton annotations.

matmul_variants  Fig. 8: naive / persistent / TMA / TMA-persistent (optionally warp-specialized)
                 Triton matmuls and cuBLAS, f16 and fp8, each launch annotated with Proton's
                 launch_metadata (name, flops<bits>, bytes); `tl.range(..., flatten=...)` on the tile loop.
moe_mlp          Figs. 9 and 10: a gpt-oss style MoE MLP (router, two grouped matmuls with gather,
                 fused SwiGLU and scatter: our stand-in for triton_kernels' matmul_ogs), and its
                 tensor-/expert-parallel shard.
moe_dist         Fig. 10: the torchrun entry point that runs one TP x EP split, one Proton profile per rank.
proton_tree      Reading, merging and diffing Proton's tree profiles (.hatchet JSON) without hatchet.

Nothing here knows about Hydra, CSVs or figures.
"""
