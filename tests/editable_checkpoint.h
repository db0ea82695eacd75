// A scratch copy of a golden test checkpoint whose safetensors header and
// config.json a test edits, for the loader's refusal tests.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "golden_util.h"

namespace dsv4::test {

inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void write_file(const std::filesystem::path& p, const std::string& data) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(data.data(), std::streamsize(data.size()));
}

class EditableCheckpoint : public ::testing::Test {
 protected:
  // Copies `files` of the case and reads its model.safetensors into
  // header_ and data_ (written back by write_checkpoint).
  void open_copy(const std::string& case_name, const std::vector<std::string>& files = {"config.json"}) {
    dir_ = std::filesystem::temp_directory_path() /
           ("dsv4_loader_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    const std::filesystem::path src = model_dir(case_name);
    for (const std::string& f : files)
      std::filesystem::copy_file(src / f, dir_ / f, std::filesystem::copy_options::overwrite_existing);
    const std::string bytes = read_file(src / "model.safetensors");
    uint64_t n;
    std::memcpy(&n, bytes.data(), 8);
    header_ = nlohmann::json::parse(bytes.substr(8, n));
    data_ = bytes.substr(8 + n);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  void write_checkpoint() {
    std::string h = header_.dump();
    while (h.size() % 8) h.push_back(' ');
    const uint64_t n = h.size();
    write_file(dir_ / "model.safetensors", std::string(reinterpret_cast<const char*>(&n), 8) + h + data_);
  }

  void edit_config(const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json c = nlohmann::json::parse(read_file(dir_ / "config.json"));
    edit(c);
    write_file(dir_ / "config.json", c.dump(2));
  }

  // Loads and returns the error message ("" if the load succeeded).
  std::string load_error(LoadMode mode = LoadMode::Mmap) {
    try {
      LoadOptions options;
      options.load_mode = mode;
      Model::load(dir_.string(), options);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }

  std::filesystem::path dir_;
  nlohmann::json header_;
  std::string data_;
};

}  // namespace dsv4::test
