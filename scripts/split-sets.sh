# Sourced by scripts/gpu-check.sh and scripts/cuda-compile-check.sh.
# split_sets "KEY=VALUE,KEY=VALUE...": one KEY=VALUE a line, split at the commas outside
# brackets, braces and quotes, so that a value can be an array or a table
# ("model.hidden=[4096,4096],data.synthetic={samples=512,image_size=8}"; it was cut at
# every comma). A value cannot hold a space (plan steps are split at spaces): TOML needs
# none.
split_sets() {
  local s=$1 cur='' quote='' depth=0 c i
  for ((i = 0; i < ${#s}; i++)); do
    c=${s:i:1}
    if [[ -n $quote ]]; then
      [[ $c == "$quote" ]] && quote=''
      cur+=$c
      continue
    fi
    case $c in
      '"' | "'") quote=$c ;;
      '[' | '{') depth=$((depth + 1)) ;;
      ']' | '}') depth=$((depth - 1)) ;;
      ,)
        if ((depth == 0)); then
          [[ -n $cur ]] && printf '%s\n' "$cur"
          cur=''
          continue
        fi
        ;;
    esac
    cur+=$c
  done
  [[ -n $cur ]] && printf '%s\n' "$cur"
  return 0
}
