// The teaching view as pictures: the frames of replay_contents (teach_view.h) drawn as SVG, one panel per round.
//
// A panel shows the ranks as boxes in a row, an arrow per message of the round from the sender's box to the
// receiver's (orange when the receiver adds it to its own, blue when it copies it), labelled with the chunk and
// its bytes as the text view names them, and each rank's blocks beneath its box. The SVG stacks every round's
// panel from the inputs down; the HTML page holds the same panels inline with a step slider (and `#step=K` in its
// address selects round K), with no script, style or font from the network.
#pragma once

#include <string>

#include "collectives/tools/teach_view.h"

namespace emu::coll::teach {

struct PictureText {
  std::string title;    // "all_reduce with ring on 4 ranks: 8 elements of float32, S = 32 B"
  std::string summary;  // the algorithm's one line
};

// A standalone SVG document; empty `replay.frames` draws nothing but the title.
std::string format_svg(const Replay& replay, const PictureText& text);
// A standalone HTML page with the panels and the slider.
std::string format_html(const Replay& replay, const PictureText& text);

}  // namespace emu::coll::teach
