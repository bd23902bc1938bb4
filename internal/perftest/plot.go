package perftest

// A small PNG plotter with the standard library only: series of (message
// size, figure) points on a log2 x axis and a linear y axis from zero,
// with axes, ticks, labels, a legend and a built-in 5×7 bitmap font
// (upper case; lower case is drawn as upper case). Plot runs in the
// caller's goroutine and keeps no state.

import (
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"
	"math"
	"strings"
)

// Point is one (x, y) of a series; X is a message size in bytes (> 0).
type Point struct{ X, Y float64 }

// Series is one line of a plot (one run).
type Series struct {
	Name   string
	Points []Point
}

const (
	plotW, plotH = 900, 540
	marginL      = 110
	marginR      = 30
	marginT      = 70
	marginB      = 70
	fontScale    = 2
	glyphW       = 6 * fontScale // 5 columns and a gap
)

var palette = []color.RGBA{
	{0x1f, 0x77, 0xb4, 0xff}, {0xd6, 0x27, 0x28, 0xff}, {0x2c, 0xa0, 0x2c, 0xff},
	{0xff, 0x7f, 0x0e, 0xff}, {0x94, 0x67, 0xbd, 0xff}, {0x8c, 0x56, 0x4b, 0xff},
}

// Plot draws the series as a PNG into w.
func Plot(w io.Writer, title, xlabel, ylabel string, series []Series) error {
	img := image.NewRGBA(image.Rect(0, 0, plotW, plotH))
	for i := range img.Pix {
		img.Pix[i] = 0xff
	}
	minX, maxX, maxY := math.Inf(1), math.Inf(-1), 0.0
	for _, s := range series {
		for _, p := range s.Points {
			if p.X <= 0 || math.IsNaN(p.Y) || math.IsInf(p.Y, 0) {
				return fmt.Errorf("plot: point (%v, %v) of %q cannot be drawn", p.X, p.Y, s.Name)
			}
			minX, maxX, maxY = math.Min(minX, p.X), math.Max(maxX, p.X), math.Max(maxY, p.Y)
		}
	}
	if math.IsInf(minX, 1) {
		minX, maxX = 1, 2
	}
	lx0, lx1 := math.Floor(math.Log2(minX)), math.Ceil(math.Log2(maxX))
	if lx1 <= lx0 {
		lx0, lx1 = lx0-1, lx1+1
	}
	ymax, ystep := niceAxis(maxY)

	x0, x1 := marginL, plotW-marginR
	y0, y1 := plotH-marginB, marginT // y0 is the bottom
	px := func(x float64) int {
		return x0 + int(math.Round((math.Log2(x)-lx0)/(lx1-lx0)*float64(x1-x0)))
	}
	py := func(y float64) int { return y0 - int(math.Round(y/ymax*float64(y0-y1))) }

	black := color.RGBA{0, 0, 0, 0xff}
	grid := color.RGBA{0xdd, 0xdd, 0xdd, 0xff}
	// Grid, ticks and tick labels.
	for v := 0.0; v <= ymax*1.0001; v += ystep {
		y := py(v)
		hline(img, x0, x1, y, grid)
		hline(img, x0-6, x0, y, black)
		lbl := trimFloat(v)
		drawText(img, x0-10-len(lbl)*glyphW, y-7, lbl, black)
	}
	every := 1
	for (lx1-lx0)/float64(every) > 12 {
		every++
	}
	for e := lx0; e <= lx1; e++ {
		x := px(math.Exp2(e))
		vline(img, x, y1, y0, grid)
		vline(img, x, y0, y0+6, black)
		if int(e-lx0)%every == 0 {
			lbl := sizeLabel(int64(math.Exp2(e)))
			if e < 0 {
				lbl = trimFloat(math.Exp2(e))
			}
			drawText(img, x-len(lbl)*glyphW/2, y0+12, lbl, black)
		}
	}
	// Axes.
	hline(img, x0, x1, y0, black)
	vline(img, x0, y1, y0, black)
	// Labels.
	drawText(img, (plotW-len(title)*glyphW)/2, 14, title, black)
	drawText(img, x0, y1-24, ylabel, black)
	drawText(img, (x0+x1-len(xlabel)*glyphW)/2, plotH-26, xlabel, black)
	// Series and legend.
	for i, s := range series {
		c := palette[i%len(palette)]
		for j, p := range s.Points {
			x, y := px(p.X), py(p.Y)
			fillRect(img, x-3, y-3, x+3, y+3, c)
			if j > 0 {
				q := s.Points[j-1]
				thickLine(img, px(q.X), py(q.Y), x, y, c)
			}
		}
		ly := y1 + 10 + i*22
		lx := x1 - 20 - len(s.Name)*glyphW - 30
		fillRect(img, lx, ly+4, lx+20, ly+8, c)
		drawText(img, lx+28, ly, s.Name, black)
	}
	return png.Encode(w, img)
}

// niceAxis returns an axis maximum ≥ v and a tick step giving 4 to 10
// ticks, both round numbers.
func niceAxis(v float64) (top, step float64) {
	if v <= 0 {
		return 1, 0.25
	}
	v *= 1.05
	mag := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{0.1, 0.2, 0.25, 0.5, 1, 2, 2.5, 5, 10} {
		step = m * mag
		if v/step <= 8 {
			break
		}
	}
	return math.Ceil(v/step) * step, step
}

func trimFloat(v float64) string {
	s := fmt.Sprintf("%.3f", v)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	if s == "" || s == "-0" {
		return "0"
	}
	return s
}

func set(img *image.RGBA, x, y int, c color.RGBA) {
	if image.Pt(x, y).In(img.Rect) {
		img.SetRGBA(x, y, c)
	}
}

func hline(img *image.RGBA, xa, xb, y int, c color.RGBA) {
	for x := xa; x <= xb; x++ {
		set(img, x, y, c)
	}
}

func vline(img *image.RGBA, x, ya, yb int, c color.RGBA) {
	for y := min(ya, yb); y <= max(ya, yb); y++ {
		set(img, x, y, c)
	}
}

func fillRect(img *image.RGBA, xa, ya, xb, yb int, c color.RGBA) {
	for y := ya; y <= yb; y++ {
		hline(img, xa, xb, y, c)
	}
}

// thickLine draws a 2-pixel line (Bresenham).
func thickLine(img *image.RGBA, xa, ya, xb, yb int, c color.RGBA) {
	dx, dy := abs(xb-xa), -abs(yb-ya)
	sx, sy := sign(xb-xa), sign(yb-ya)
	e := dx + dy
	for {
		fillRect(img, xa, ya, xa+1, ya+1, c)
		if xa == xb && ya == yb {
			return
		}
		e2 := 2 * e
		if e2 >= dy {
			e += dy
			xa += sx
		}
		if e2 <= dx {
			e += dx
			ya += sy
		}
	}
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}

func sign(v int) int {
	switch {
	case v < 0:
		return -1
	case v > 0:
		return 1
	}
	return 0
}

// drawText draws s with its top-left corner at (x, y).
func drawText(img *image.RGBA, x, y int, s string, c color.RGBA) {
	for _, r := range strings.ToUpper(s) {
		g, ok := font[r]
		if ok {
			for row, bits := range g {
				for col := 0; col < 5; col++ {
					if bits[col] == '#' {
						fillRect(img, x+col*fontScale, y+row*fontScale, x+col*fontScale+fontScale-1, y+row*fontScale+fontScale-1, c)
					}
				}
			}
		}
		x += glyphW
	}
}

// font is a 5×7 bitmap font: seven rows of five columns per glyph.
var font = map[rune][7]string{
	'0': {".###.", "#...#", "#..##", "#.#.#", "##..#", "#...#", ".###."},
	'1': {"..#..", ".##..", "..#..", "..#..", "..#..", "..#..", ".###."},
	'2': {".###.", "#...#", "....#", "...#.", "..#..", ".#...", "#####"},
	'3': {"#####", "...#.", "..#..", "...#.", "....#", "#...#", ".###."},
	'4': {"...#.", "..##.", ".#.#.", "#..#.", "#####", "...#.", "...#."},
	'5': {"#####", "#....", "####.", "....#", "....#", "#...#", ".###."},
	'6': {"..##.", ".#...", "#....", "####.", "#...#", "#...#", ".###."},
	'7': {"#####", "....#", "...#.", "..#..", ".#...", ".#...", ".#..."},
	'8': {".###.", "#...#", "#...#", ".###.", "#...#", "#...#", ".###."},
	'9': {".###.", "#...#", "#...#", ".####", "....#", "...#.", ".##.."},
	'A': {".###.", "#...#", "#...#", "#####", "#...#", "#...#", "#...#"},
	'B': {"####.", "#...#", "#...#", "####.", "#...#", "#...#", "####."},
	'C': {".###.", "#...#", "#....", "#....", "#....", "#...#", ".###."},
	'D': {"###..", "#..#.", "#...#", "#...#", "#...#", "#..#.", "###.."},
	'E': {"#####", "#....", "#....", "####.", "#....", "#....", "#####"},
	'F': {"#####", "#....", "#....", "####.", "#....", "#....", "#...."},
	'G': {".###.", "#...#", "#....", "#.###", "#...#", "#...#", ".####"},
	'H': {"#...#", "#...#", "#...#", "#####", "#...#", "#...#", "#...#"},
	'I': {".###.", "..#..", "..#..", "..#..", "..#..", "..#..", ".###."},
	'J': {"..###", "...#.", "...#.", "...#.", "...#.", "#..#.", ".##.."},
	'K': {"#...#", "#..#.", "#.#..", "##...", "#.#..", "#..#.", "#...#"},
	'L': {"#....", "#....", "#....", "#....", "#....", "#....", "#####"},
	'M': {"#...#", "##.##", "#.#.#", "#.#.#", "#...#", "#...#", "#...#"},
	'N': {"#...#", "#...#", "##..#", "#.#.#", "#..##", "#...#", "#...#"},
	'O': {".###.", "#...#", "#...#", "#...#", "#...#", "#...#", ".###."},
	'P': {"####.", "#...#", "#...#", "####.", "#....", "#....", "#...."},
	'Q': {".###.", "#...#", "#...#", "#...#", "#.#.#", "#..#.", ".##.#"},
	'R': {"####.", "#...#", "#...#", "####.", "#.#..", "#..#.", "#...#"},
	'S': {".####", "#....", "#....", ".###.", "....#", "....#", "####."},
	'T': {"#####", "..#..", "..#..", "..#..", "..#..", "..#..", "..#.."},
	'U': {"#...#", "#...#", "#...#", "#...#", "#...#", "#...#", ".###."},
	'V': {"#...#", "#...#", "#...#", "#...#", "#...#", ".#.#.", "..#.."},
	'W': {"#...#", "#...#", "#...#", "#.#.#", "#.#.#", "#.#.#", ".#.#."},
	'X': {"#...#", "#...#", ".#.#.", "..#..", ".#.#.", "#...#", "#...#"},
	'Y': {"#...#", "#...#", ".#.#.", "..#..", "..#..", "..#..", "..#.."},
	'Z': {"#####", "....#", "...#.", "..#..", ".#...", "#....", "#####"},
	'.': {".....", ".....", ".....", ".....", ".....", ".##..", ".##.."},
	',': {".....", ".....", ".....", ".....", ".##..", "..#..", ".#..."},
	'/': {".....", "....#", "...#.", "..#..", ".#...", "#....", "....."},
	'[': {".###.", ".#...", ".#...", ".#...", ".#...", ".#...", ".###."},
	']': {".###.", "...#.", "...#.", "...#.", "...#.", "...#.", ".###."},
	'(': {"...#.", "..#..", ".#...", ".#...", ".#...", "..#..", "...#."},
	')': {".#...", "..#..", "...#.", "...#.", "...#.", "..#..", ".#..."},
	'-': {".....", ".....", ".....", "#####", ".....", ".....", "....."},
	'_': {".....", ".....", ".....", ".....", ".....", ".....", "#####"},
	':': {".....", ".##..", ".##..", ".....", ".##..", ".##..", "....."},
	'%': {"##...", "##..#", "...#.", "..#..", ".#...", "#..##", "...##"},
	'+': {".....", "..#..", "..#..", "#####", "..#..", "..#..", "....."},
	'=': {".....", ".....", "#####", ".....", "#####", ".....", "....."},
	'<': {"...#.", "..#..", ".#...", "#....", ".#...", "..#..", "...#."},
	'>': {".#...", "..#..", "...#.", "....#", "...#.", "..#..", ".#..."},
}
