// A cgroup hierarchy in a temporary directory, for the tests of what a
// container's limits do (the CPU quota in test_threads, the memory room in
// test_memory): files written under `root` as the kernel would show them.
#pragma once
#include <gtest/gtest.h>

#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <string>

namespace dsv4::test {

struct FakeCgroupTree {
  std::filesystem::path root;
  FakeCgroupTree() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    root = std::filesystem::temp_directory_path() /
           ("dsv4-cgroup-" + std::to_string(::getpid()) + "-" + info->test_suite_name() + "-" + info->name());
    std::filesystem::remove_all(root);
  }
  ~FakeCgroupTree() { std::filesystem::remove_all(root); }
  void write(const std::string& rel, const std::string& text) {
    const std::filesystem::path p = root / rel;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
};

}  // namespace dsv4::test
