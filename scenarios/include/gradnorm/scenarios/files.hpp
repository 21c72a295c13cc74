#pragma once
// The one way gradnorm opens a path it reads and checks a path it writes, for every command
// (docs/design.md §12): a file read is a regular file of bounded size; an output never
// replaces what is not a regular file, and its folder is proved writable before any work.
// Messages name the path and what it is: a folder, a FIFO, a device, a symbolic link loop.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace gradnorm::scenarios {

// Why `path` cannot be read as a regular file ("does not exist", "is not a regular file (a
// folder)", "is a symbolic link loop", "cannot be read: Permission denied"), or nullopt.
std::optional<std::string> why_unreadable(const std::string& path);

// The whole of the regular file `path`, at most `max_bytes` of it. Throws InvalidInput
// "WHAT 'PATH' REASON" where why_unreadable has a reason, or the file holds more (a file that
// grows while read included).
std::string read_regular_file(const std::string& path, std::uintmax_t max_bytes, std::string_view what);

// Why an output cannot be written to `path`, or nullopt: it is empty; it exists and is not a
// regular file (followed through symbolic links); its folder is missing, is not a folder, or
// takes no new file (probed by creating and removing one, so a read-only file system such as
// /sys is found out here); a name in it is longer than the file system allows.
std::optional<std::string> why_unwritable(const std::string& path);

// The absolute form of `path` (relative to the working folder now), for paths fixed before
// any user code runs: a step that changes the working folder moves nothing.
std::string absolute_path(const std::string& path);

}  // namespace gradnorm::scenarios
