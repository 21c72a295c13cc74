// What a rank reads from its launcher's variables (docs/design.md §13): torchrun's, its
// agent's store among them, Slurm's, and the hostlist's first host; malformed values are
// input errors naming the variable.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "gradnorm/harness/transport.hpp"
#include "gradnorm/scenarios/scenario.hpp"

namespace gradnorm::harness {
namespace {

const std::vector<std::string> kEveryVariable = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
    "MASTER_PORT", "GRADNORM_STORE", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
    "SLURM_NODEID", "SLURM_JOB_NODELIST", "SLURM_STEP_NODELIST", "SLURM_JOB_ID"};

// Sets exactly `values` among the launcher variables for the test's lifetime.
class Environment {
 public:
  explicit Environment(const std::map<std::string, std::string>& values) {
    for (const std::string& name : kEveryVariable) {
      if (const char* old = std::getenv(name.c_str())) saved_[name] = old;
      unsetenv(name.c_str());
    }
    for (const auto& [name, value] : values) setenv(name.c_str(), value.c_str(), 1);
  }
  ~Environment() {
    for (const std::string& name : kEveryVariable) unsetenv(name.c_str());
    for (const auto& [name, value] : saved_) setenv(name.c_str(), value.c_str(), 1);
  }
  Environment(const Environment&) = delete;
  Environment& operator=(const Environment&) = delete;

 private:
  std::map<std::string, std::string> saved_;
};

std::map<std::string, std::string> torchrun_worker(int rank) {
  return {{"RANK", std::to_string(rank)},         {"LOCAL_RANK", std::to_string(rank)},
          {"WORLD_SIZE", "4"},                    {"LOCAL_WORLD_SIZE", "2"},
          {"GROUP_RANK", "1"},                    {"MASTER_ADDR", "10.1.2.3"},
          {"MASTER_PORT", "29400"},               {"TORCHELASTIC_USE_AGENT_STORE", "True"},
          {"TORCHELASTIC_RUN_ID", "job-17"},      {"TORCHELASTIC_RESTART_COUNT", "2"}};
}

TEST(Launchers, TorchrunsAgentStoreMakesEveryRankAClientAndKeepsTheRestartCount) {
  auto values = torchrun_worker(3);
  values["LOCAL_RANK"] = "1";
  const Environment env(values);
  const Rendezvous r = rendezvous_from_environment();
  EXPECT_EQ(r.rank, 3);
  EXPECT_EQ(r.world_size, 4);
  EXPECT_EQ(r.local_rank, 1);
  EXPECT_EQ(r.local_world_size, 2);
  EXPECT_EQ(r.group_rank, 1);
  EXPECT_EQ(r.master_addr, "10.1.2.3");
  EXPECT_EQ(r.master_port, 29400);
  EXPECT_TRUE(r.agent_store);
  EXPECT_EQ(r.restart_count, 2);
  EXPECT_EQ(r.run_id, "job-17");
  EXPECT_EQ(r.launcher, "torchrun");
  EXPECT_EQ(describe_process_group(r, "gloo"),
            "gloo processes x 4 under torchrun (agent store, restart 2)");
}

TEST(Launchers, APlainEnvironmentIsNotTorchrun) {
  const Environment env({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"},
                         {"MASTER_PORT", "29500"}});
  const Rendezvous r = rendezvous_from_environment();
  EXPECT_FALSE(r.agent_store);
  EXPECT_EQ(r.launcher, "env");
  EXPECT_EQ(r.local_rank, -1);
  EXPECT_EQ(describe_process_group(r, "gloo"), "gloo processes x 2");
}

TEST(Launchers, TorchrunWithoutItsAgentStoreSaysRankZeroServes) {
  auto values = torchrun_worker(0);
  values["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  values["TORCHELASTIC_RESTART_COUNT"] = "0";
  const Environment env(values);
  const Rendezvous r = rendezvous_from_environment();
  EXPECT_FALSE(r.agent_store);
  EXPECT_EQ(describe_process_group(r, "gloo"), "gloo processes x 4 under torchrun (rank 0's store)");
}

// Each malformed variable is an input error that names it.
void expect_rejected(const std::map<std::string, std::string>& values, const std::string& name,
                     Rendezvous (*read)() = rendezvous_from_environment) {
  const Environment env(values);
  try {
    (void)read();
    ADD_FAILURE() << "accepted a malformed " << name;
  } catch (const scenarios::InvalidInput& error) {
    EXPECT_NE(std::string(error.what()).find(name), std::string::npos) << error.what();
  }
}

TEST(Launchers, MalformedTorchrunVariablesAreInputErrorsNamingThem) {
  auto values = torchrun_worker(0);
  values["TORCHELASTIC_USE_AGENT_STORE"] = "yes";
  expect_rejected(values, "TORCHELASTIC_USE_AGENT_STORE");
  values = torchrun_worker(0);
  values.erase("TORCHELASTIC_RESTART_COUNT");
  expect_rejected(values, "TORCHELASTIC_RESTART_COUNT");
  values = torchrun_worker(0);
  values["TORCHELASTIC_RESTART_COUNT"] = "-1";
  expect_rejected(values, "TORCHELASTIC_RESTART_COUNT");
  values = torchrun_worker(0);
  values["LOCAL_RANK"] = "2";  // LOCAL_WORLD_SIZE is 2
  expect_rejected(values, "LOCAL_RANK");
  values = torchrun_worker(0);
  values["LOCAL_WORLD_SIZE"] = "5";  // WORLD_SIZE is 4
  expect_rejected(values, "LOCAL_WORLD_SIZE");
  values = torchrun_worker(0);
  values["GROUP_RANK"] = "x";
  expect_rejected(values, "GROUP_RANK");
  values = torchrun_worker(0);
  values["GRADNORM_STORE"] = "file:/tmp/store";
  expect_rejected(values, "GRADNORM_STORE");
}

TEST(Launchers, TheFirstHostOfASlurmHostlist) {
  EXPECT_EQ(first_slurm_host("localhost"), "localhost");
  EXPECT_EQ(first_slurm_host("node[07-09,12],gpu1"), "node07");
  EXPECT_EQ(first_slurm_host("node[12,07-09]"), "node12");
  EXPECT_EQ(first_slurm_host("gpu1,node[07-09]"), "gpu1");
  EXPECT_EQ(first_slurm_host("rack[1-2]-n[3,5]"), "rack1-n3");
  EXPECT_EQ(first_slurm_host("a-b[001-100]"), "a-b001");
  for (const std::string bad : {"", "node[1-3", "node]1", "[", ",node1", "node 1"}) {
    EXPECT_THROW((void)first_slurm_host(bad), scenarios::InvalidInput) << "'" << bad << "'";
  }
}

TEST(Launchers, SlurmsVariablesMapToRanksAndAJobPort) {
  const Environment env({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "1"},
                         {"SLURM_NODEID", "1"}, {"SLURM_JOB_NODELIST", "gpu[1-2]"},
                         {"SLURM_STEP_NODELIST", "gpu[2-3]"}, {"SLURM_JOB_ID", "123456"}});
  const Rendezvous r = rendezvous_from_slurm();
  EXPECT_EQ(r.rank, 3);
  EXPECT_EQ(r.world_size, 4);
  EXPECT_EQ(r.local_rank, 1);
  EXPECT_EQ(r.group_rank, 1);
  EXPECT_EQ(r.master_addr, "gpu2");  // the step's first node, where task 0 runs
  EXPECT_EQ(r.master_port, kSlurmBasePort + 3456);
  EXPECT_EQ(r.launcher, "slurm");
  EXPECT_EQ(describe_process_group(r, "gloo"), "gloo processes x 4 under slurm");
  // --launcher env without RANK reads the same.
  const Rendezvous detected = rendezvous_from_environment();
  EXPECT_EQ(detected.launcher, "slurm");
  EXPECT_EQ(detected.rank, 3);
}

TEST(Launchers, MasterAddrAndPortOverrideSlurmsChoice) {
  const Environment env({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"},
                         {"SLURM_JOB_NODELIST", "n[1-2]"}, {"SLURM_JOB_ID", "7"},
                         {"MASTER_ADDR", "10.0.0.9"}, {"MASTER_PORT", "4242"}});
  const Rendezvous r = rendezvous_from_slurm();
  EXPECT_EQ(r.master_addr, "10.0.0.9");
  EXPECT_EQ(r.master_port, 4242);
}

TEST(Launchers, MalformedSlurmVariablesAreInputErrorsNamingThem) {
  const auto rejected = [](const std::map<std::string, std::string>& values, const std::string& name) {
    expect_rejected(values, name, rendezvous_from_slurm);
  };

  rejected({{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_NODELIST", "n1"},
            {"SLURM_JOB_ID", "1"}}, "SLURM_PROCID");
  rejected({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_ID", "1"}},
           "SLURM_JOB_NODELIST");
  rejected({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_NODELIST", "n1"}},
           "SLURM_JOB_ID");
  rejected({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_NODELIST", "n[1"},
            {"SLURM_JOB_ID", "1"}}, "n[1");
}

}  // namespace
}  // namespace gradnorm::harness
