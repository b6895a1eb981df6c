#include <iostream>

int main() {
  std::cout << "dynmig\n";
  return 0;
}
