/* A backend plugin whose ELF constructor runs on dlopen and creates the file named by
 * $TIER_TEST_MARKER: the proof that a tool loaded it. Its backend never starts (create refuses),
 * but its options schema is real, so a tool that loads it can check a profile's options. */
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include "tier/plugin.h"

__attribute__((constructor)) static void write_marker(void) {
  const char* path = getenv("TIER_TEST_MARKER");
  if (path == NULL) return;
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd >= 0) close(fd);
}

static void* create(const void* context, char* error, size_t error_len) {
  (void)context;
  if (error_len > 0) {
    static const char kWhy[] = "NotSupported: ctor_marker is a test plugin";
    size_t n = sizeof kWhy < error_len ? sizeof kWhy : error_len;
    for (size_t i = 0; i + 1 < n; ++i) error[i] = kWhy[i];
    error[n - 1] = '\0';
  }
  return NULL;
}

static void destroy(void* object) { (void)object; }

static const struct tier_plugin kCtorMarker = {
    TIER_PLUGIN_ABI_VERSION, TIER_PLUGIN_BACKEND, "ctor_marker",
    "test plugin: its constructor writes $TIER_TEST_MARKER",
    "[{\"name\": \"level\", \"type\": \"uint\", \"default\": 1, \"max\": 9, \"doc\": \"unused\"}]",
    &create, &destroy};

__attribute__((visibility("default"))) const struct tier_plugin* tier_plugin_entry(void) {
  return &kCtorMarker;
}
