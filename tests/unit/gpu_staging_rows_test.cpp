// SLOT staging-row admission (reference §2.2): smallest free id first, never blocks, release only
// what is acquired, quarantine is permanent. Pure host logic: runs without a GPU.
#include <doctest/doctest.h>

#include "slot_staging.hpp"

using tier::Code;
using tier::gpu::StagingRows;

TEST_CASE("rows come smallest first and run out without blocking") {
  StagingRows rows(3);
  CHECK(rows.try_acquire() == 0u);
  CHECK(rows.try_acquire() == 1u);
  CHECK(rows.try_acquire() == 2u);
  CHECK_FALSE(rows.try_acquire().has_value());
  CHECK(rows.release(1));
  CHECK(rows.release(0));
  CHECK(rows.try_acquire() == 0u);
  CHECK(rows.free_rows() == 1);
}

TEST_CASE("release needs an acquired row") {
  StagingRows rows(2);
  CHECK(rows.release(0).code() == Code::kBadState);
  CHECK(rows.release(7).code() == Code::kBadState);
  auto id = rows.try_acquire();
  CHECK(rows.release(*id));
  CHECK(rows.release(*id).code() == Code::kBadState);  // twice
}

TEST_CASE("a quarantined row is never handed out or released again") {
  StagingRows rows(2);
  auto a = rows.try_acquire();
  auto b = rows.try_acquire();
  CHECK(rows.quarantine(*a));
  CHECK(rows.quarantined() == 1);
  CHECK(rows.release(*a).code() == Code::kBadState);
  CHECK(rows.quarantine(*a).code() == Code::kBadState);
  CHECK(rows.release(*b));
  CHECK(rows.try_acquire() == *b);
  CHECK_FALSE(rows.try_acquire().has_value());  // the pool shrank for good
  CHECK(rows.release(*b));
  CHECK(rows.free_rows() == 1);
}
