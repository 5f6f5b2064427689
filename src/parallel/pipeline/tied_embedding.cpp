// SPDX-License-Identifier: BSD-3-Clause
#include "parallel/pipeline/tied_embedding.hpp"

#include <cstring>

#include "layers/grad_reduction.hpp"

namespace ndmini {

void TiedEmbedding::reduce_grads(real* grads, std::size_t n, Precision wire) {
  if (pair_ != nullptr) all_reduce_grads(*pair_, grads, n, wire);
}

bool TiedEmbedding::identical(const real* params, std::size_t n) {
  if (pair_ == nullptr) return true;
  View1D theirs("ndmini::tied_wte_peer", n);
  const int peer = 1 - pair_->rank();
  pair_
      ->batch_p2p(
          {{P2POp::Kind::send, const_cast<real*>(params), n, peer, 0}, {P2POp::Kind::recv, theirs.data(), n, peer, 0}})
      .wait();
  using Unmanaged = Kokkos::View<const real*, MemSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  auto mine_host = Kokkos::create_mirror_view_and_copy(HostSpace(), Unmanaged(params, n));
  auto theirs_host = Kokkos::create_mirror_view_and_copy(HostSpace(), theirs);
  return std::memcmp(mine_host.data(), theirs_host.data(), n * sizeof(real)) == 0;
}

}  // namespace ndmini
