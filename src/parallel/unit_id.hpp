// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// A unit of the parameter layout (ParamLayout::unit_size: what FSDP gathers
// and reduces at once), or explicitly none.
#include <string>

namespace ndmini {

class UnitId {
 public:
  constexpr UnitId() = default;                            // none
  constexpr explicit UnitId(int index) : index_(index) {}  // index >= 0
  static constexpr UnitId none() { return UnitId(); }
  // ChunkUnits (model/gpt.hpp) still marks a missing unit with a negative index.
  static constexpr UnitId of_layout_index(int index) { return index < 0 ? none() : UnitId(index); }

  constexpr bool is_none() const { return index_ == kNone; }
  constexpr explicit operator bool() const { return !is_none(); }
  // Its index into the layout's units; only for a unit that is not none.
  constexpr int index() const { return index_; }
  friend constexpr bool operator==(UnitId a, UnitId b) { return a.index_ == b.index_; }
  friend constexpr bool operator!=(UnitId a, UnitId b) { return a.index_ != b.index_; }
  std::string name() const { return is_none() ? "none" : "unit " + std::to_string(index_); }

 private:
  static constexpr int kNone = -1;
  int index_ = kNone;
};

}  // namespace ndmini
