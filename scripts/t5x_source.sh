# Sourced by scripts/test.sh and scripts/test_newest.sh. T5X's wheel lacks its decoder-only
# network's Python files, which tests/t5x read from a T5X source checkout named by T5X_SOURCE
# (tests/t5x/t5x_decoder_only.py). `t5x_source DIR`: where T5X_SOURCE is unset and a T5X git
# mirror is at hand, extracts those files into DIR and exports T5X_SOURCE=DIR; else does
# nothing (the tests that need them skip, saying so).
t5x_source() {
  local mirror=/work/.mirror/google-research+t5x/repo
  if [ -n "${T5X_SOURCE:-}" ] || [ ! -d "$mirror" ]; then
    return 0
  fi
  mkdir -p "$1/t5x/examples/decoder_only"
  local name
  for name in layers network; do
    git --git-dir="$mirror" show "HEAD:t5x/examples/decoder_only/$name.py" \
      > "$1/t5x/examples/decoder_only/$name.py"
  done
  export T5X_SOURCE=$1
}
