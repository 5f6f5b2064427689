// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Internal to io/: the checkpoint folder's policy. What its names mean
// (step_N, the `latest` marker, the temporary and replaced folders of a save),
// which checkpoints are kept (keep-K), what is debris, and whether there is
// room. The one-writer lock (CheckpointDirLock) is public: io/checkpoint.hpp.
// Rank 0 alone calls these (they touch the file system, not the other ranks).
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace ndmini::io::detail {

inline constexpr const char* kLatestName = "latest";

// ".step_00000042.tmp": a save in progress; ".step_00000042.old": a step
// being replaced by a new save of it.
std::string tmp_dirname(std::int64_t step);
std::string old_dirname(std::int64_t step);
// The marker's temporary name and the name the old marker is kept under
// until a save is agreed.
std::string marker_tmp_name();
std::string marker_prev_name();

// Steps of the committed checkpoints (folders under their final name), ascending.
std::vector<std::int64_t> committed_steps(const std::filesystem::path& root);
// "4, 8, 12", or "none".
std::string steps_text(const std::vector<std::int64_t>& steps);
std::string available_text(const std::filesystem::path& root);

// The step `latest` names; nullopt when root or its marker does not exist.
// A damaged marker throws Error naming the available steps.
std::optional<std::int64_t> read_latest(const std::filesystem::path& root);
// The marker's step, -1 when missing or damaged.
std::int64_t read_latest_quietly(const std::filesystem::path& root);

// Room a checkpoint of `data_bytes` in `tensors` datasets needs.
std::uint64_t needed_bytes(std::uint64_t data_bytes, std::size_t tensors);
// Throws Error when root's file system has less than `needed` bytes free;
// `what` says what for ("to save checkpoint step 8").
void require_free_space(const std::filesystem::path& root, std::uint64_t needed, const std::string& what);

// How prune disposes of the steps it drops: removed there and then, or only
// renamed out of the way (set_aside: a rename per step, so the caller's
// critical path does not wait for a checkpoint's blocks to be freed), left
// for remove_set_aside() to remove in the background.
enum class PruneMode { remove, set_aside };
// Keeps the step just saved and the newest keep-1 committed steps below it,
// and removes debris. Steps above the one just saved belong to a run this one
// was resumed away from; they stay.
void prune(const std::filesystem::path& root, std::int64_t step, int keep, PruneMode mode = PruneMode::remove);
// The name a step set aside by prune has until it is removed ("." first:
// debris to every reader; any writer of the folder removes it).
std::string set_aside_dirname(std::int64_t step);
// Removes every step set aside in root. Never throws: returns what failed
// ("" when nothing did); what is left is debris the next writer removes.
std::string remove_set_aside(const std::filesystem::path& root) noexcept;

}  // namespace ndmini::io::detail
