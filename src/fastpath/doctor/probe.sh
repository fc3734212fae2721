# fastpath POSIX sh probe: the toolchain facts that can be gathered on a target WITHOUT Python.
#
# Sent on stdin to `sh -s` when the target has no usable python3 (see fastpath/remote.py).
# Prints one JSON object between '--- fastpath facts begin/end ---' lines, a subset of the "fastpath.facts/1" schema (described in probe.py's docstring), with
# probe.kind = "sh"; every fact it cannot collect is null and named in probe.errors with the
# reason. Writes nothing on the target. Needs only sh, sed and tr; uses uname, nvidia-smi,
# dpkg-query, rpm, gcc and readlink when present.
#
# Everything runs inside main() with stdin from /dev/null: sh reads this script from stdin, and a
# command that read stdin would eat the rest of the script.

main() {
  set +e
  ERRORS=""
  NO_PY_REASON="${FASTPATH_NO_PYTHON_REASON:-no python on target}"

  # --- JSON helpers -------------------------------------------------------------------------
  # js VALUE -> a JSON string (control characters dropped, newlines and tabs escaped)
  js() {
    printf '"%s"' "$(printf '%s' "$1" | tr -d '\000-\010\013\014\016-\037' | tr '\t' ' ' \
      | sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/\r//g' | sed -e ':a' -e 'N' -e '$!ba' -e 's/\n/\\n/g')"
  }
  # jsn VALUE -> JSON string, or null when empty
  jsn() { if [ -n "$1" ]; then js "$1"; else printf 'null'; fi; }
  # jnum VALUE -> the value if it is a plain number, else null
  jnum() {
    case "$1" in
      '' | *[!0-9.]* | *.*.* | .*) printf 'null' ;;
      *) printf '%s' "$1" ;;
    esac
  }
  add_error() {  # add_error KEY REASON
    if [ -n "$ERRORS" ]; then ERRORS="$ERRORS,"; fi
    ERRORS="$ERRORS$(js "$1"):$(js "$2")"
  }
  have() { command -v "$1" >/dev/null 2>&1; }
  first_line() { sed -n '1p'; }
  # realpath_of PATH: resolved path (readlink -f when present, else a cd -P walk of the dir)
  realpath_of() {
    if have readlink && readlink -f "$1" >/dev/null 2>&1; then
      readlink -f "$1"
    else
      _d=$(cd -P "${1%/*}" 2>/dev/null && pwd)
      if [ -n "$_d" ]; then printf '%s/%s\n' "$_d" "${1##*/}"; else printf '%s\n' "$1"; fi
    fi
  }

  START=$( (date +%s) 2>/dev/null)

  # --- host ---------------------------------------------------------------------------------
  if have uname; then
    H_NAME=$(uname -n 2>/dev/null); H_KERNEL=$(uname -r 2>/dev/null); H_ARCH=$(uname -m 2>/dev/null)
    H_SYS=$(uname -s 2>/dev/null)
  else
    H_NAME=""; H_KERNEL=""; H_ARCH=""; H_SYS=""
    add_error "host.kernel" "could not collect: uname not found on target"
  fi
  if [ -z "$H_NAME" ] && [ -r /etc/hostname ]; then read -r H_NAME </etc/hostname; fi
  H_OS=""
  if [ -r /etc/os-release ]; then
    while IFS='=' read -r k v; do
      if [ "$k" = PRETTY_NAME ]; then H_OS=$(printf '%s' "$v" | sed -e 's/^"//' -e 's/"$//'); fi
    done </etc/os-release
  fi
  if [ -z "$H_OS" ]; then H_OS="$H_SYS"; fi
  H_GLIBC=""
  if have getconf; then H_GLIBC=$(getconf GNU_LIBC_VERSION 2>/dev/null | sed -n 's/^glibc //p'); fi
  if [ -z "$H_GLIBC" ] && have ldd; then
    H_GLIBC=$(ldd --version 2>&1 | first_line | sed -n 's/.* \([0-9][0-9]*\.[0-9][0-9]*\)$/\1/p')
  fi
  if [ -z "$H_GLIBC" ]; then
    add_error "host.glibc" "could not collect: neither getconf GNU_LIBC_VERSION nor ldd --version answered (musl or busybox?)"
  fi
  HOST="{\"hostname\":$(jsn "$H_NAME"),\"os\":$(jsn "$H_OS"),\"kernel\":$(jsn "$H_KERNEL"),\"arch\":$(jsn "$H_ARCH"),\"glibc\":$(jsn "$H_GLIBC"),\"python\":null,\"source\":\"uname, /etc/os-release, getconf GNU_LIBC_VERSION (sh probe)\"}"
  add_error "host.python" "could not collect: $NO_PY_REASON"

  # --- env (secret-looking names are redacted here, never sent) -------------------------------
  ENV_JSON=""
  env_names=$( (env 2>/dev/null || export -p 2>/dev/null) | sed -n \
    -e 's/^export //' \
    -e 's/^\(CUDA_[A-Za-z0-9_]*\)=.*/\1/p' -e 's/^\(TRITON_[A-Za-z0-9_]*\)=.*/\1/p' \
    -e 's/^\(TORCH_[A-Za-z0-9_]*\)=.*/\1/p' -e 's/^\(HF_[A-Za-z0-9_]*\)=.*/\1/p' \
    -e 's/^\(NVIDIA_[A-Za-z0-9_]*\)=.*/\1/p' \
    -e 's/^\(USE_HUB_KERNELS\)=.*/\1/p')
  for name in $env_names PATH LD_LIBRARY_PATH CONDA_PREFIX USE_HUB_KERNELS CUDA_HOME CUDA_PATH; do
    case " $SEEN_ENV " in *" $name "*) continue ;; esac
    SEEN_ENV="$SEEN_ENV $name"
    eval "isset=\${$name+x}"
    [ -n "$isset" ] || continue
    case "$name" in
      *TOKEN* | *SECRET* | *PASS* | *PWD* | *KEY* | *AUTH* | *CREDENTIAL*) value="<redacted>" ;;
      *) eval "value=\${$name}" ;;
    esac
    if [ -n "$ENV_JSON" ]; then ENV_JSON="$ENV_JSON,"; fi
    ENV_JSON="$ENV_JSON$(js "$name"):$(js "$value")"
  done

  # --- GPUs and driver (nvidia-smi) -----------------------------------------------------------
  GPUS="[]"; DRIVER="null"
  if have nvidia-smi; then
    smi_csv=$(nvidia-smi --query-gpu=index,name,driver_version,compute_cap,memory.total \
      --format=csv,noheader,nounits 2>/dev/null)
    if [ -n "$smi_csv" ]; then
      GPUS=""; drv=""
      while IFS=',' read -r idx gname gdrv gcc gmem; do
        gname=$(printf '%s' "$gname" | sed 's/^ *//;s/ *$//'); gdrv=$(printf '%s' "$gdrv" | tr -d ' ')
        gcc=$(printf '%s' "$gcc" | tr -d ' '); gmem=$(printf '%s' "$gmem" | tr -d ' ')
        [ -n "$drv" ] || drv="$gdrv"
        if [ -n "$GPUS" ]; then GPUS="$GPUS,"; fi
        GPUS="$GPUS{\"index\":$(jnum "$(printf '%s' "$idx" | tr -d ' ')"),\"name\":$(jsn "$gname"),\"driver\":$(jsn "$gdrv"),\"compute_capability\":$(jsn "$gcc"),\"memory_mib\":$(jnum "$gmem"),\"source\":\"nvidia-smi --query-gpu\"}"
      done <<EOF_SMI
$smi_csv
EOF_SMI
      GPUS="[$GPUS]"
      cuda_ver=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9][0-9.]*\).*/\1/p' | first_line)
      DRIVER="{\"version\":$(jsn "$drv"),\"cuda_version\":$(jsn "$cuda_ver"),\"source\":\"nvidia-smi\"}"
    else
      add_error "gpus" "could not collect: nvidia-smi found but printed no GPU"
      add_error "driver" "could not collect: nvidia-smi found but printed no GPU"
    fi
  elif [ -r /proc/driver/nvidia/version ]; then
    drv=$(sed -n 's/.*Kernel Module *\([0-9][0-9.]*\).*/\1/p' /proc/driver/nvidia/version | first_line)
    DRIVER="{\"version\":$(jsn "$drv"),\"cuda_version\":null,\"source\":\"/proc/driver/nvidia/version\"}"
    add_error "gpus" "could not collect via nvidia-smi: nvidia-smi not found on PATH"
  else
    add_error "gpus" "could not collect via nvidia-smi: nvidia-smi not found on PATH"
  fi

  # --- nvcc candidates ------------------------------------------------------------------------
  # Every place nvcc is known to live (the same list as probe.py's nvcc_candidate_sources), each
  # with how it was found.
  CANDS=""  # newline-separated "path|found_by"
  add_cand() { CANDS="$CANDS
$1|$2"; }
  IFS_SAVE=$IFS; IFS=:
  for d in $PATH; do
    [ -n "$d" ] || continue
    if [ -x "$d/nvcc" ] && [ ! -d "$d/nvcc" ]; then add_cand "$d/nvcc" "PATH"; fi
  done
  IFS=$IFS_SAVE
  if [ -n "$CUDA_HOME" ]; then add_cand "$CUDA_HOME/bin/nvcc" "CUDA_HOME"; fi
  if [ -n "$CUDA_PATH" ]; then add_cand "$CUDA_PATH/bin/nvcc" "CUDA_PATH"; fi
  if [ -n "$CONDA_PREFIX" ]; then add_cand "$CONDA_PREFIX/bin/nvcc" "CONDA_PREFIX"; fi
  for f in /usr/local/cuda/bin/nvcc /usr/local/cuda-*/bin/nvcc /usr/bin/nvcc /opt/cuda/bin/nvcc \
    /opt/conda/bin/nvcc /usr/local/lib/python3*/*-packages/nvidia/cu1*/bin/nvcc \
    /usr/lib/python3*/*-packages/nvidia/cu1*/bin/nvcc /opt/conda/lib/python3*/site-packages/nvidia/cu1*/bin/nvcc \
    "$HOME"/.local/lib/python3*/site-packages/nvidia/cu1*/bin/nvcc \
    "$CONDA_PREFIX"/lib/python3*/site-packages/nvidia/cu1*/bin/nvcc; do
    case "$f" in *'*'*) continue ;; esac
    add_cand "$f" "well-known location"
  done
  # pip nvidia-cuda-nvcc-cu12 ships ptxas only (NVIDIA/cuda-python#2100): report it as such.
  for f in /usr/local/lib/python3*/*-packages/nvidia/cuda_nvcc/bin/ptxas \
    /usr/lib/python3*/*-packages/nvidia/cuda_nvcc/bin/ptxas \
    "$HOME"/.local/lib/python3*/site-packages/nvidia/cuda_nvcc/bin/ptxas \
    "$CONDA_PREFIX"/lib/python3*/site-packages/nvidia/cuda_nvcc/bin/ptxas; do
    case "$f" in *'*'*) continue ;; esac
    if [ ! -e "${f%/ptxas}/nvcc" ]; then add_cand "$f" "pip wheel (ptxas only)"; fi
  done
  NVCC=""; SEEN_REAL=""
  while IFS='|' read -r path how; do
    [ -n "$path" ] || continue
    [ -x "$path" ] || continue
    real=$(realpath_of "$path")
    # merge duplicates (same resolved file found several ways): one entry, several found_by
    key=$(printf '%s' "$real" | tr -c 'A-Za-z0-9\n' '_')
    eval "prev=\${FB_$key}"
    if [ -n "$prev" ]; then
      case ",$prev," in *",$(js "$how"),"*) ;; *) eval "FB_$key=\"\$prev,\$(js \"\$how\")\"" ;; esac
      continue
    fi
    eval "FB_$key=\$(js \"\$how\")"
    SEEN_REAL="$SEEN_REAL
$key|$path|$real"
  done <<EOF_C
$CANDS
EOF_C
  while IFS='|' read -r key path real; do
    [ -n "$key" ] || continue
    eval "fb=\${FB_$key}"
    case "$path" in
      */ptxas) kind="ptxas-only-wheel"; ver=""; ;;
      *) kind="nvcc"
         # "release 12.8, V12.8.93" -> version 12.8.93 (as the Python probe reports it)
         rel=$("$path" --version 2>&1 | sed -n 's/.*release \([0-9][0-9]*\)\.\([0-9][0-9]*\)\(, V\([0-9.]*\)\)\{0,1\}.*/\1 \2 \4/p' | first_line) ;;
    esac
    major=""; minor=""; ver=""
    if [ -n "$rel" ]; then
      set -- $rel
      major=$1; minor=$2; ver=${3:-$1.$2}
    fi
    rel=""
    if [ -n "$NVCC" ]; then NVCC="$NVCC,"; fi
    NVCC="$NVCC{\"path\":$(js "$path"),\"realpath\":$(js "$real"),\"version\":$(jsn "$ver"),\"major\":$(jnum "$major"),\"minor\":$(jnum "$minor"),\"found_by\":[$fb],\"major_matches_torch\":null,\"kind\":$(js "$kind"),\"source\":$(js "$path --version (sh probe)")}"
  done <<EOF_R
$SEEN_REAL
EOF_R

  # --- what torch's _find_cuda_home would pick (CUDA_HOME|CUDA_PATH -> which nvcc -> /usr/local/cuda)
  how=""; th=""
  if [ -n "$CUDA_HOME" ]; then th="$CUDA_HOME"; how="CUDA_HOME"
  elif [ -n "$CUDA_PATH" ]; then th="$CUDA_PATH"; how="CUDA_PATH"
  else
    w=$(command -v nvcc 2>/dev/null)
    case "$w" in
      /*) th="${w%/*}"; th="${th%/*}"; how="which nvcc" ;;  # torch does not resolve links
      *) if [ -d /usr/local/cuda ]; then th=/usr/local/cuda; how="/usr/local/cuda"; fi ;;
    esac
  fi
  hn=false; h1=false; h2=false
  if [ -n "$th" ]; then
    [ -x "$th/bin/nvcc" ] && hn=true
    [ -e "$th/include/cuda_runtime.h" ] && h1=true
    [ -e "$th/include/cusparse.h" ] && h2=true
  fi
  div=false
  if [ -n "$CUDA_HOME" ] && [ -n "$CUDA_PATH" ] && [ "$CUDA_HOME" != "$CUDA_PATH" ]; then div=true; fi
  CUDA_HOME_JSON="{\"torch_would_use\":$(jsn "$th"),\"how\":$(jsn "$how"),\"has_nvcc\":$hn,\"headers\":{\"cuda_runtime.h\":$h1,\"cusparse.h\":$h2},\"cuda_home_env\":$(jsn "$CUDA_HOME"),\"cuda_path_env\":$(jsn "$CUDA_PATH"),\"diverge\":$div,\"source\":\"torch.utils.cpp_extension._find_cuda_home rules, evaluated by the sh probe\"}"

  # --- package databases ----------------------------------------------------------------------
  # "name|version" lines -> [{"name":..,"version":..}, ...]
  name_version_rows_json() {
    out=""
    while IFS='|' read -r pname pver; do
      [ -n "$pname" ] || continue
      if [ -n "$out" ]; then out="$out,"; fi
      out="$out{\"name\":$(js "$pname"),\"version\":$(js "$pver")}"
    done <<EOF_ROWS
$1
EOF_ROWS
    printf '[%s]' "$out"
  }
  DPKG="[]"
  if have dpkg-query; then
    rows=$(dpkg-query -W -f='${db:Status-Abbrev}|${Package}|${Version}\n' 'cuda-nvcc-*' 'nvidia-cuda-toolkit' \
      'cuda-toolkit-*' 'cuda-cudart-dev-*' 'libcusparse-dev-*' 2>/dev/null | sed -n 's/^ii *|//p')
    DPKG=$(name_version_rows_json "$rows")
  fi
  RPM="[]"
  if have rpm; then
    rows=$(rpm -qa --qf '%{NAME}|%{VERSION}-%{RELEASE}\n' 'cuda-nvcc*' 'cuda-toolkit*' 'cuda-cudart-devel*' 2>/dev/null)
    RPM=$(name_version_rows_json "$rows")
  fi
  if ! have dpkg-query && ! have rpm; then
    add_error "package_db" "could not collect: neither dpkg-query nor rpm found on target"
  fi

  # --- gcc ------------------------------------------------------------------------------------
  GCC="null"
  if have gcc; then
    gv=$(gcc -dumpfullversion 2>/dev/null || gcc -dumpversion 2>/dev/null)
    GCC="{\"version\":$(jsn "$gv"),\"path\":$(jsn "$(command -v gcc)")}"
  fi

  # --- facts only Python can give ---------------------------------------------------------------
  for k in torch triton nvrtc packages; do
    add_error "$k" "could not collect: $NO_PY_REASON"
  done

  END=$( (date +%s) 2>/dev/null)
  SECS="null"
  if [ -n "$START" ] && [ -n "$END" ]; then SECS=$((END - START)); fi

  # Framed (as probe.py --framed): a login banner before it or noise after it is ignored.
  printf '\n--- fastpath facts begin ---\n'
  printf '{"schema":"fastpath.facts/1","probe":{"kind":"sh","python":null,"errors":{%s},"seconds":%s},' "$ERRORS" "$SECS"
  printf '"host":%s,"env":{%s},"gpus":%s,"driver":%s,"torch":null,"triton":null,"nvrtc":null,' "$HOST" "$ENV_JSON" "$GPUS" "$DRIVER"
  printf '"nvcc_candidates":[%s],"cuda_home":%s,"package_db":{"dpkg":%s,"rpm":%s,"source":"dpkg-query -W; rpm -qa (sh probe)"},"gcc":%s,"packages":null}\n' \
    "$NVCC" "$CUDA_HOME_JSON" "$DPKG" "$RPM" "$GCC"
  printf '%s\n' '--- fastpath facts end ---'
}
main </dev/null
