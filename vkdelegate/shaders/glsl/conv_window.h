// The window geometry of the convolution shaders (conv2d.glsl, conv2d_col.glsl) as
// specialization constants 3..11, in the order ops/families/convolution.py passes
// them: kernel, stride, padding and dilation (height, width), then the number of
// spatial dims (1: N, C, L; 2: N, C, H, W).
#ifndef VKDELEGATE_CONV_WINDOW_H
#define VKDELEGATE_CONV_WINDOW_H

layout(constant_id = 3) const int KH = 1;
layout(constant_id = 4) const int KW = 1;
layout(constant_id = 5) const int SH = 1;
layout(constant_id = 6) const int SW = 1;
layout(constant_id = 7) const int PH = 0;
layout(constant_id = 8) const int PW = 0;
layout(constant_id = 9) const int DH = 1;
layout(constant_id = 10) const int DW = 1;
layout(constant_id = 11) const int SPATIAL = 2;

#endif
