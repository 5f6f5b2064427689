#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# --help shows ndmini's usage alone (Kokkos' option list is one line away,
# behind --kokkos-help), every subcommand's help names its options, and
# --kokkos-* options still reach Kokkos.
source "$(dirname "$0")/lib.sh"

# no_kokkos_list FILE: Kokkos' own option list is not in FILE.
no_kokkos_list() {
  if grep -qiE "Kokkos command line arguments|--kokkos-threads|--kokkos-num-threads|--kokkos-device-id" "$1"; then
    cat "$1"
    fail "Kokkos' option list is in $1"
  fi
}

run 1 --help >help.txt 2>&1 || fail "--help exited non-zero"
cat help.txt
no_kokkos_list help.txt
grep -qF "Usage: ndmini [OPTIONS] SUBCOMMAND" help.txt || fail "no usage line"
for word in train check ckpt plan --version --build-info "--kokkos-help lists them"; do
  grep -qF -- "$word" help.txt || fail "--help does not mention $word"
done
[ "$(wc -l <help.txt)" -le 25 ] || fail "--help is $(wc -l <help.txt) lines long"

# Each subcommand's help: its usage and every option it takes.
declare -A options=([train]="--set --metrics --resume --show-mesh" [check]="--set --world" [ckpt]="info verify"
                    ["ckpt info"]="path" ["ckpt verify"]="path" [plan]="--cluster --world --top --json --search --precision --set --calibrate --out")
for sub in train check ckpt "ckpt info" "ckpt verify" plan; do
  # shellcheck disable=SC2086
  run 1 $sub --help >sub.txt 2>&1 || fail "$sub --help exited non-zero"
  no_kokkos_list sub.txt
  grep -qF "Usage: ndmini $sub " sub.txt || fail "$sub --help: no usage line"
  for o in ${options[$sub]}; do grep -qF -- "$o" sub.txt || fail "$sub --help does not mention $o"; done
done

# Kokkos' list, on request, once.
run 1 --kokkos-help >kokkos.txt 2>&1 || fail "--kokkos-help exited non-zero"
grep -qF -- "--kokkos-help" kokkos.txt || fail "--kokkos-help did not print Kokkos' options"
# A Kokkos option is still accepted, before or after the subcommand.
run 1 --kokkos-disable-warnings check tiny.toml >out.txt 2>&1 || { cat out.txt; fail "a --kokkos-* option was refused"; }
grep -qF "deck OK" out.txt || fail "check did not run with a --kokkos-* option"
run 1 check tiny.toml --kokkos-disable-warnings >out.txt 2>&1 || { cat out.txt; fail "a --kokkos-* option was refused"; }

# --version and --help start no Kokkos (a GPU build answers them where no
# device is): a tool library that cannot load is reported when Kokkos
# starts (Kokkos 3.4 reads KOKKOS_PROFILE_LIBRARY, 4.x KOKKOS_TOOLS_LIBS),
# and only a command that runs starts it.
tools=(env KOKKOS_PROFILE_LIBRARY=/nonexistent/libkp.so KOKKOS_TOOLS_LIBS=/nonexistent/libkp.so)
"${tools[@]}" "$MPIEXEC" "$MPIEXEC_NUMPROC_FLAG" 1 "$NDMINI" check tiny.toml >probe.txt 2>&1 || true
grep -q "libkp.so" probe.txt || { cat probe.txt; fail "Kokkos did not report the missing tool library: no probe"; }
for args in "--version" "--help" "train --help" "--build-info"; do
  # shellcheck disable=SC2086
  "${tools[@]}" "$MPIEXEC" "$MPIEXEC_NUMPROC_FLAG" 1 "$NDMINI" $args >out.txt 2>&1 || fail "$args exited non-zero"
  ! grep -q "libkp.so" out.txt || { cat out.txt; fail "$args started Kokkos"; }
done
echo "ok: --help is ndmini's alone; --kokkos-help and --kokkos-* options work; --version and --help start no Kokkos"
