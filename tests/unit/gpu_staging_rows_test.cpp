// SLOT staging-row admission (reference §2.2): smallest free id first, never blocks, release only
// what is acquired, quarantine is permanent, thread safe. Pure host logic: runs without a GPU.
#include <doctest/doctest.h>

#include <array>
#include <atomic>
#include <thread>
#include <vector>

#include "support/slot_staging.hpp"

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

TEST_CASE("admission is thread safe: concurrent acquire and release never share a row") {
  constexpr std::size_t kRows = 3, kThreads = 4, kRounds = 20000;
  StagingRows rows(kRows);
  std::array<std::atomic<int>, kRows> holders{};
  std::atomic<int> shared{0}, acquired{0};
  std::vector<std::thread> ts;
  for (std::size_t t = 0; t < kThreads; ++t)
    ts.emplace_back([&] {
      for (std::size_t i = 0; i < kRounds; ++i) {
        auto id = rows.try_acquire();
        if (!id) continue;
        ++acquired;
        if (holders[*id].fetch_add(1) != 0) ++shared;
        holders[*id].fetch_sub(1);
        if (!rows.release(*id)) ++shared;
      }
    });
  for (auto& t : ts) t.join();
  CHECK(shared.load() == 0);
  CHECK(acquired.load() > 0);
  CHECK(rows.free_rows() == kRows);
  CHECK(rows.quarantined() == 0);
}
