// How an algorithm list (emu --collectives) steers NCCL: the NCCL_ALGO value it becomes, and the names NCCL cannot
// run, which are bad input before any communicator is made.
#include <gtest/gtest.h>

#include <string>

#include "collectives/nccl/select.h"
#include "emu/check.h"

namespace emu::coll {
namespace {

TEST(NcclAlgoSetting, NamesBecomeNcclsPerCollectiveForm) {
  EXPECT_EQ(nccl_algo_setting("all_reduce=tree"), "allreduce:tree");
  EXPECT_EQ(nccl_algo_setting("all_reduce=ring,all_gather=ring,reduce_scatter=ring"),
            "allreduce:ring;allgather:ring;reducescatter:ring");
  EXPECT_EQ(nccl_algo_setting("broadcast=ring,reduce=ring"), "broadcast:ring;reduce:ring");
}

TEST(NcclAlgoSetting, KindsLeftToNcclAreNotSteered) {
  EXPECT_EQ(nccl_algo_setting(""), "");
  EXPECT_EQ(nccl_algo_setting("all_reduce=mpi,all_gather=nccl"), "");
  EXPECT_EQ(nccl_algo_setting("all_to_all=pairwise,barrier=dissemination,all_reduce=tree"), "allreduce:tree");
}

TEST(NcclAlgoSetting, AlgorithmsNcclDoesNotRunAreBadInput) {
  try {
    nccl_algo_setting("all_reduce=rhd");
    FAIL() << "rhd accepted";
  } catch (const InputError& error) {
    EXPECT_NE(std::string(error.what())
                  .find("all_reduce=rhd: over NCCL the collectives run inside NCCL, which offers "
                        "ring and tree for all_reduce"),
              std::string::npos)
        << error.what();
  }
  try {
    nccl_algo_setting("all_gather=tree");
    FAIL() << "tree for all_gather accepted";
  } catch (const InputError& error) {
    EXPECT_NE(std::string(error.what()).find("offers ring for all_gather"), std::string::npos) << error.what();
  }
  EXPECT_THROW(nccl_algo_setting("allreduce=ring"), InputError);
  EXPECT_THROW(nccl_algo_setting("all_reduce"), InputError);
}

}  // namespace
}  // namespace emu::coll
