#!/usr/bin/env bash
# The direction of dependencies, from the #include lines (STYLE.md: hooks -> shim API -> core
# -> planner/protocol/common; offloadd and the planner include nothing from preload/).
#
# Every quoted include is resolved to the folder it comes from, by the include roots the
# build uses: planner/X, common/X -> the repository root; offload/X -> protocol/ or include/;
# offloadd/X, offloadctl/X -> daemon/; offload_version.h -> common/ (made from
# common/version.h.in); anything else that exists under preload/ -> preload/.
# Each folder may then include only from the folders listed for it below. An include that
# resolves nowhere fails the test, so that a new include root is added here on purpose.
#
#   planner/           planner, protocol             (pure: no I/O, no driver)
#   protocol/          protocol, include
#   common/            common, protocol, include
#   daemon/offloadd/   offloadd, common, protocol, include
#   daemon/offloadctl/ offloadctl, planner, common, protocol, include, and preload/core/ and
#                      preload/residency/ only: `offloadctl replay` drives the core's executor
#                      (--offload) or the residency manager (--cap) on the simulated driver
#   preload/hooks/     hooks, include, protocol, planner/types.h, and of the shim only shim.h
#                      and core/driver.h (the hooks ask the shim through a few free functions)
#
# Usage: tests/layout_test.sh [REPO_ROOT]
set -euo pipefail
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$root"

fail=0
complain() {
  echo "layout: $*" >&2
  fail=1
}

# The folder a quoted include `inc` resolves to: planner, common, protocol, include, offloadd,
# offloadctl, preload/core, preload/residency, preload/hooks, preload, or "?".
origin() {
  local inc=$1
  case "$inc" in
    planner/*) [ -f "$inc" ] && echo planner && return ;;
    common/*) [ -f "$inc" ] && echo common && return ;;
    offload/*)
      [ -f "protocol/$inc" ] && echo protocol && return
      [ -f "include/$inc" ] && echo include && return ;;
    offloadd/* | offloadctl/*) [ -f "daemon/$inc" ] && echo "${inc%%/*}" && return ;;
    offload_version.h) [ -f common/version.h.in ] && echo common && return ;;  # generated from it
    *)
      if [ -f "preload/$inc" ]; then
        case "$inc" in
          core/*) echo preload/core ;;
          residency/*) echo preload/residency ;;
          hooks/*) echo preload/hooks ;;
          *) echo preload ;;
        esac
        return
      fi ;;
  esac
  echo "?"
}

# check DIR ALLOWED...: every quoted include of the sources under DIR comes from an allowed folder.
check() {
  local dir=$1
  shift
  local allowed=" $* " file inc from
  [ -d "$dir" ] || { complain "$dir: no such folder (update tests/layout_test.sh)"; return; }
  while IFS= read -r file; do
    while IFS= read -r inc; do
      from=$(origin "$inc")
      if [ "$from" = "?" ]; then
        complain "$file includes \"$inc\", which resolves to no known include root"
      elif [[ "$allowed" != *" $from "* ]]; then
        complain "$file includes \"$inc\" (from $from/): $dir may include only from: $*"
      fi
    done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$file")
  done < <(find "$dir" -type f \( -name '*.h' -o -name '*.cpp' \) | sort)
}

check planner planner protocol
check protocol protocol include
check common common protocol include
check daemon/offloadd offloadd common protocol include
check daemon/offloadctl offloadctl planner common protocol include preload/core preload/residency

# The hooks forward into the shim through shim.h alone: never the runtime, the tracker or a planner.
while IFS= read -r file; do
  while IFS= read -r inc; do
    case "$inc" in
      hooks/* | shim.h | core/driver.h | planner/types.h | offload/*) ;;
      *) complain "$file includes \"$inc\": the hooks may include hooks/, shim.h, core/driver.h, planner/types.h and offload/ only" ;;
    esac
  done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$file")
done < <(find preload/hooks -type f \( -name '*.h' -o -name '*.cpp' \) | sort)

if [ "$fail" -ne 0 ]; then
  echo "layout: dependencies point the wrong way (see above)" >&2
  exit 1
fi
echo "layout: dependencies point down"
