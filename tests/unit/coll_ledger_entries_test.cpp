// The traffic ledger on its own (no MPI): what it books per (kind, phase), its totals, and its table's "expected"
// column, which must say NO when an algorithm moved other bytes than it declared.
#include <gtest/gtest.h>

#include <string>

#include "collectives/ledger.h"

namespace emu::coll {
namespace {

TEST(Ledger, BooksMovedAndExpectedApartAndSumsThem) {
  Ledger ledger("world");
  ledger.charge(CollectiveKind::kAllReduce, "bucket 0", {100, 100}, {100, 100}, 0.5);
  ledger.charge(CollectiveKind::kAllReduce, "bucket 0", {60, 60}, {60, 60}, 0.25);
  ledger.charge(CollectiveKind::kAllGather, "unit 1", {30, 40}, {30, 48}, 0.125);

  const LedgerEntry bucket = ledger.at(CollectiveKind::kAllReduce, "bucket 0");
  EXPECT_EQ(bucket.calls, 2u);
  EXPECT_EQ(bucket.moved, (Traffic{160, 160}));
  EXPECT_EQ(bucket.expected, (Traffic{160, 160}));
  EXPECT_DOUBLE_EQ(bucket.seconds, 0.75);

  // An algorithm that received 8 bytes fewer than it declared: the ledger keeps both figures.
  const LedgerEntry unit = ledger.at(CollectiveKind::kAllGather, "unit 1");
  EXPECT_EQ(unit.calls, 1u);
  EXPECT_EQ(unit.moved, (Traffic{30, 40}));
  EXPECT_EQ(unit.expected, (Traffic{30, 48}));

  EXPECT_EQ(ledger.at(CollectiveKind::kBroadcast, "bucket 0").calls, 0u);
  EXPECT_EQ(ledger.total(CollectiveKind::kAllReduce).calls, 2u);
  const LedgerEntry all = ledger.total();
  EXPECT_EQ(all.calls, 3u);
  EXPECT_EQ(all.moved, (Traffic{190, 200}));
  EXPECT_EQ(all.expected, (Traffic{190, 208}));
}

TEST(Ledger, TableSaysNoWhereMovedDiffersFromExpected) {
  Ledger ledger("world");
  ledger.charge(CollectiveKind::kAllReduce, "as declared", {8, 8}, {8, 8}, 0);
  ledger.charge(CollectiveKind::kAllGather, "short by 8", {30, 40}, {30, 48}, 0);
  const std::string table = ledger.format();
  const size_t declared = table.find("as declared");
  const size_t short_row = table.find("short by 8");
  ASSERT_NE(declared, std::string::npos);
  ASSERT_NE(short_row, std::string::npos);
  EXPECT_NE(table.substr(declared, table.find('\n', declared) - declared).find("yes"), std::string::npos) << table;
  EXPECT_NE(table.substr(short_row, table.find('\n', short_row) - short_row).find("NO"), std::string::npos) << table;
}

}  // namespace
}  // namespace emu::coll
