// Registration of the disk backend (built in when liburing is found).
#include "disk_backend.hpp"
#include "tier/plugin.hpp"

namespace {
constexpr const char kDiskOptions[] = R"JSON([
  {"name": "path", "type": "path",
   "doc": "directory of the store (created when missing); on a local file system with O_DIRECT (ext4, xfs, btrfs; not tmpfs)"},
  {"name": "region_size", "type": "size", "default": "16MiB", "min": 65536, "max": 4294967296,
   "doc": "size of a region, the unit of appending and of eviction; also the largest object. The capacity holds floor(capacity / region_size) regions, at least 2"},
  {"name": "block_size", "type": "size", "default": 4096, "min": 512, "max": 4096,
   "doc": "O_DIRECT block: the alignment of buffers, offsets and sizes (a power of two, at least the device's logical block size, at most 4KiB, the page TierStack pads images to)"},
  {"name": "queue_depth", "type": "uint", "default": 64, "min": 1, "max": 4096,
   "doc": "most get/put/remove requests in flight; submit() accepts no more until poll() reaps some"},
  {"name": "durable", "type": "bool", "default": false,
   "doc": "open the files with O_DSYNC so that a completed put also survives a power loss (kill -9 safety needs no sync)"},
  {"name": "lock_timeout", "type": "duration", "default": "5s", "max": 600000000,
   "doc": "how long start-up waits for the store's lock: a process killed with I/O in flight holds it until the kernel has finished that I/O; a live process holding it is an error"},
  {"name": "preallocate", "type": "bool", "default": false,
   "doc": "reserve the whole data file when formatting (fallocate), so that a full file system is reported at start-up instead of as failed saves"},
  {"name": "mode", "type": "enum", "default": "0600", "choices": ["0600", "0640", "0644"],
   "doc": "permission bits of the store's files, set whatever the umask (the directory, when the tier creates it, adds x where r is set: 0700, 0750, 0755). 0600: only the owner reads the cache; 0640/0644 let the group/everyone read it (the cached KV can be inverted into the users' text). Files and directories of another user are refused in every mode"}
])JSON";
constexpr tier_plugin kDisk = tier::make_backend_plugin<tier::disk::DiskBackend>(
    "disk", "persistent io_uring disk tier (O_DIRECT, log-structured regions)", kDiskOptions);
}  // namespace

TIER_REGISTER_PLUGIN(disk, kDisk)
