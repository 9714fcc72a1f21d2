#include "codec.h"
int main(void)
{
    return obd_codec_best() == 0;
}
