#include "core/cgroup.h"

#include <fstream>
#include <sstream>

namespace dsv4 {

void for_each_cgroup_dir(const std::string& root, const std::string& proc_self_cgroup, const std::string& controller,
                         const std::vector<std::string>& v1_mounts,
                         const std::function<void(const std::string& dir, bool v2)>& visit) {
  std::stringstream lines(proc_self_cgroup);
  std::string line;
  while (std::getline(lines, line)) {
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    const std::string path = line.substr(b + 1);
    std::vector<std::string> mounts;
    const bool v2 = controllers.empty();
    if (v2) {
      mounts = {root, root + "/unified"};
    } else {
      std::stringstream ss(controllers);
      std::string c;
      bool has = false;
      while (std::getline(ss, c, ',')) has |= c == controller;
      if (!has) continue;
      for (const std::string& m : v1_mounts) mounts.push_back(root + "/" + m);
    }
    for (const std::string& mount : mounts) {
      std::string p = path;
      while (true) {
        visit(p == "/" || p.empty() ? mount : mount + (p[0] == '/' ? "" : "/") + p, v2);
        const size_t slash = p.find_last_of('/');
        if (slash == std::string::npos || slash == 0) {
          if (p == "/") break;
          p = "/";  // a relative or one-level path: the mount's root is next
        } else {
          p.resize(slash);
        }
      }
    }
  }
}

std::string read_proc_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream text;
  text << f.rdbuf();
  return text.str();
}

}  // namespace dsv4
