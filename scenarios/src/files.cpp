#include "gradnorm/scenarios/files.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "gradnorm/scenarios/scenario.hpp"

namespace gradnorm::scenarios {
namespace {

namespace fs = std::filesystem;

std::string kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a file";
}

std::string stat_failure(int error) {
  switch (error) {
    case ENOENT: return "does not exist";
    case ELOOP: return "is a symbolic link loop";
    case ENOTDIR: return "does not exist (a name in it is a file, not a folder)";
    case ENAMETOOLONG: return "is a name longer than the file system allows";
    default: return fmt::format("cannot be read: {}", std::strerror(error));
  }
}

std::string folder_of(const std::string& path) {
  const fs::path target(path);
  return target.has_parent_path() ? target.parent_path().string() : ".";
}

}  // namespace

std::optional<std::string> why_unreadable(const std::string& path) {
  if (path.empty()) return "is an empty path";
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return stat_failure(errno);
  if (!S_ISREG(st.st_mode)) return fmt::format("is not a regular file ({})", kind_of(st.st_mode));
  if (::access(path.c_str(), R_OK) != 0) return fmt::format("cannot be read: {}", std::strerror(errno));
  return std::nullopt;
}

std::string read_regular_file(const std::string& path, std::uintmax_t max_bytes, std::string_view what) {
  if (auto why = why_unreadable(path)) throw InvalidInput(fmt::format("{} '{}' {}", what, path, *why));
  // O_NONBLOCK: a path swapped for a FIFO after the check above cannot block the open.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw InvalidInput(fmt::format("{} '{}' {}", what, path, stat_failure(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw InvalidInput(fmt::format("{} '{}' is not a regular file", what, path));
  }
  const auto too_big = [&] {
    return InvalidInput(fmt::format("{} '{}' holds more than the {} bytes a {} may hold", what, path,
                                    max_bytes, what));
  };
  if (static_cast<std::uintmax_t>(st.st_size) > max_bytes) {
    ::close(fd);
    throw too_big();
  }
  // Read at most one byte past the cap: a file that grew after the size was read is refused.
  std::string text;
  char chunk[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      ::close(fd);
      throw InvalidInput(fmt::format("{} '{}' cannot be read: {}", what, path, std::strerror(error)));
    }
    if (n == 0) break;
    text.append(chunk, static_cast<std::size_t>(n));
    if (text.size() > max_bytes) {
      ::close(fd);
      throw too_big();
    }
  }
  ::close(fd);
  return text;
}

std::optional<std::string> why_unwritable(const std::string& path) {
  if (path.empty()) return "is an empty path";
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    if (!S_ISREG(st.st_mode)) {
      return fmt::format("is {}; an output is written only to a regular file", kind_of(st.st_mode));
    }
  } else if (errno == ELOOP) {
    return "is a symbolic link loop";
  } else if (errno == ENAMETOOLONG) {
    return "is a name longer than the file system allows";
  }
  const std::string folder = folder_of(path);
  struct stat fst {};
  if (::stat(folder.c_str(), &fst) != 0) {
    return fmt::format("cannot be written: the folder {} {}", folder, stat_failure(errno));
  }
  if (!S_ISDIR(fst.st_mode)) return fmt::format("cannot be written: {} is not a folder", folder);
  const std::string name = fs::path(path).filename().string();
  const long longest = ::pathconf(folder.c_str(), _PC_NAME_MAX);
  if (name.empty() || name == "." || name == "..") return "names a folder, not a file";
  if (longest > 0 && static_cast<long>(name.size()) > longest) {
    return fmt::format("is a name of {} bytes, longer than the {} the file system allows", name.size(),
                       longest);
  }
  // A real probe: access(W_OK) says yes for root on a read-only file system.
  const int fd = ::open(folder.c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600);
  if (fd >= 0) {
    ::close(fd);
    return std::nullopt;
  }
  if (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL) {  // no unnamed files here
    const std::string probe = fmt::format("{}/.gradnorm-probe.{}", folder, ::getpid());
    const int named = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (named >= 0) {
      ::close(named);
      ::unlink(probe.c_str());
      return std::nullopt;
    }
  }
  return fmt::format("cannot be written: the folder {} takes no new file ({})", folder, std::strerror(errno));
}

std::string absolute_path(const std::string& path) {
  if (path.empty() || path == "-") return path;
  std::error_code error;
  const fs::path absolute = fs::absolute(path, error);
  return error ? path : absolute.lexically_normal().string();
}

}  // namespace gradnorm::scenarios
