// Concatenates the page's CSS with uPlot's into dist/app.css and copies
// index.html and report.css into dist/ (all embedded into the server binary).
const fs = require('fs');
fs.mkdirSync('dist', { recursive: true });
const css = fs.readFileSync('node_modules/uplot/dist/uPlot.min.css', 'utf8') + '\n' + fs.readFileSync('src/app.css', 'utf8');
fs.writeFileSync('dist/app.css', css);
fs.copyFileSync('src/index.html', 'dist/index.html');
fs.copyFileSync('src/report.css', 'dist/report.css');
