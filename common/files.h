// Files and directories that another user of the machine must not be able to redirect: the
// daemon's socket directory, the pool segment, OFFLOAD_TRACE's directory and the files in it.
//
// A directory is trusted only if this user owns it and nobody else may write to it (else
// another user could plant a socket, a segment or a symlink there first). Files are written
// without following a symlink at their name, and a file replaced whole is written under a
// fresh name made with O_EXCL and renamed over the old one.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <string>

namespace offload {

// Mode bits a private directory may not have: the daemon's runtime directory is 0700.
inline constexpr mode_t kNoGroupOrOther = 0077;
// Mode bits a directory holding our files may not have: nobody else may create or replace
// names in it (reading is allowed: traces in a 0755 directory are fine).
inline constexpr mode_t kNoGroupOrOtherWrite = 0022;

// "alice (uid 1000)", or "uid 1000" when the user has no name.
std::string user_text(uid_t uid);

// False with *why unless `st` (of `what`, e.g. "the pool segment /offload-pool-1000") is owned
// by `uid` and has none of the `forbidden` mode bits. *why names the owner and the mode.
bool check_owner_and_mode(const struct stat& st, const std::string& what, mode_t forbidden, std::string* why,
                          uid_t uid = getuid());

// `dir` is a directory (not a symlink to one) owned by `uid` without any of the `forbidden`
// mode bits; false with *why otherwise, or if it does not exist.
bool check_private_dir(const std::string& dir, mode_t forbidden, std::string* why, uid_t uid = getuid());

// Creates `dir` (mode 0700) if missing, then check_private_dir.
bool ensure_private_dir(const std::string& dir, mode_t forbidden, std::string* why, uid_t uid = getuid());

// OFFLOAD_TRACE's directory: created 0700 if missing; refused unless owned by `uid` and
// writable by nobody else.
inline bool prepare_trace_dir(const std::string& dir, std::string* why, uid_t uid = getuid()) {
  return ensure_private_dir(dir, kNoGroupOrOtherWrite, why, uid);
}

// Writes `data` to `path` (created 0600, or truncated), never following a symlink at `path`.
bool write_file_nofollow(const std::string& path, const std::string& data, std::string* why);

// Replaces `path` with `data` at once: written to a new file beside it (O_EXCL, O_NOFOLLOW),
// then renamed over `path` (a symlink at `path` is replaced, not followed).
bool replace_file(const std::string& path, const std::string& data, std::string* why);

// The directory part of `path`: "/a/b" for "/a/b/c", "." for "c", "/" for "/c".
std::string dir_of(const std::string& path);

}  // namespace offload
