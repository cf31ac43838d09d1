#include "common/files.h"

#include <fcntl.h>
#include <pwd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace offload {

std::string user_text(uid_t uid) {
  passwd pw{}, *res = nullptr;
  char buf[1024];
  if (getpwuid_r(uid, &pw, buf, sizeof buf, &res) == 0 && res && res->pw_name)
    return std::string(res->pw_name) + " (uid " + std::to_string(uid) + ")";
  return "uid " + std::to_string(uid);
}

bool check_owner_and_mode(const struct stat& st, const std::string& what, mode_t forbidden, std::string* why,
                          uid_t uid) {
  if (st.st_uid == uid && !(st.st_mode & forbidden)) return true;
  char mode[8];
  std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
  if (st.st_uid != uid)
    *why = what + " is not private to this user: it belongs to " + user_text(st.st_uid) + ", not to " +
           user_text(uid) + "; refusing it";
  else
    *why = what + " is not private to this user: its mode " + mode +
           " lets other users in; refusing it (chmod go-rwx it, or remove it)";
  return false;
}

bool check_private_dir(const std::string& dir, mode_t forbidden, std::string* why, uid_t uid) {
  struct stat st;
  if (lstat(dir.c_str(), &st) != 0) {
    *why = "cannot use " + dir + ": " + strerror(errno);
    return false;
  }
  if (!S_ISDIR(st.st_mode)) {
    *why = dir + " is not a directory (a symlink is not followed): refusing it";
    return false;
  }
  return check_owner_and_mode(st, "the directory " + dir, forbidden, why, uid);
}

bool ensure_private_dir(const std::string& dir, mode_t forbidden, std::string* why, uid_t uid) {
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    *why = "cannot create " + dir + ": " + strerror(errno);
    return false;
  }
  return check_private_dir(dir, forbidden, why, uid);
}

namespace {

bool write_fd(int fd, const std::string& path, const std::string& data, std::string* why) {
  const char* p = data.data();
  size_t n = data.size();
  while (n) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      *why = "cannot write " + path + ": " + strerror(w < 0 ? errno : EIO);
      return false;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// Writes `data` and closes `fd`; a failed close is a failed write (NFS reports errors there).
bool write_and_close(int fd, const std::string& path, const std::string& data, std::string* why) {
  bool ok = write_fd(fd, path, data, why);
  if (::close(fd) != 0 && ok) {
    *why = "cannot write " + path + ": " + strerror(errno);
    ok = false;
  }
  return ok;
}

}  // namespace

bool write_file_nofollow(const std::string& path, const std::string& data, std::string* why) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    *why = "cannot open " + path + ": " + strerror(errno) + (errno == ELOOP ? " (a symlink: not followed)" : "");
    return false;
  }
  return write_and_close(fd, path, data, why);
}

bool replace_file(const std::string& path, const std::string& data, std::string* why) {
  static std::atomic<unsigned> n{0};
  const std::string tmp = path + ".tmp." + std::to_string(getpid()) + "." + std::to_string(n++);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    *why = "cannot create " + tmp + ": " + strerror(errno);
    return false;
  }
  bool ok = write_and_close(fd, tmp, data, why);
  if (ok && ::rename(tmp.c_str(), path.c_str()) != 0) {
    *why = "cannot rename " + tmp + " to " + path + ": " + strerror(errno);
    ok = false;
  }
  if (!ok) ::unlink(tmp.c_str());
  return ok;
}

std::string dir_of(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace offload
